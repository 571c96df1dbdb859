//! Keel's event log in SQLite: the only crate that names `rusqlite`.
//!
//! The log is one SQLite file in WAL mode holding an append-only, hash-chained table of
//! events (the ground truth) and two projections derived from them, `intents` and `runs`,
//! written in the same transaction as the events that change them. With a payment-method
//! vault, `<log>-vault-keys` beside it holds the entries' data keys ([`vault`]). Every file is
//! created readable by its owner only. `store/FORMAT.md` specifies the stored format in prose.
//!
//! Main types:
//!
//! - [`Store`] — the cheap-to-clone handle on the writer. It implements
//!   [`engine::log::EventLog`]: a [`Command`](engine::ledger::Command) goes in, is decided
//!   against the ledger of every committed event, its events are appended, and the
//!   [`Reply`](engine::ledger::Reply) comes back after the commit. [`Store::stats`] reports
//!   commits (fsyncs), batches, events and commands.
//! - [`Reader`] — a read-only connection: events, one stream, projection rows
//!   ([`IntentRow`], [`RunRow`]), the fold ([`Reader::ledger`]) and [`Reader::verify`], which
//!   rebuilds everything from the events and reports the first [`Mismatch`].
//! - [`Options`] and [`Durability`] — how the writer sets the database up.
//! - [`Error`] — the store's operational errors, retryable kinds apart
//!   ([`Error::is_retryable`]).
//!
//! ```
//! use engine::clock::ManualClock;
//! use engine::event::{Cause, RunId, RunLimits};
//! use engine::ledger::{Action, Command, Reply, RunStart};
//! use engine::log::EventLog;
//! use std::sync::Arc;
//! use store::{Options, Store};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("keel.db");
//! let start = chrono::DateTime::parse_from_rfc3339("2025-01-01T00:00:00Z")?.to_utc();
//! let store = Store::open(&path, Options::default(), Arc::new(ManualClock::new(start)))?;
//!
//! let run_id = RunId::new("run-1");
//! let command = Command::new(Cause::command("example"), Action::StartRun).starting(Some(RunStart {
//!     run_id: run_id.clone(),
//!     workflow: "charge".to_owned(),
//!     input: serde_json::json!({}),
//!     deadline_at: start + chrono::TimeDelta::minutes(2),
//!     limits: RunLimits {
//!         cost_minor_max: None,
//!         attempts_per_intent_max: 3,
//!         reconciliations_per_intent_max: 5,
//!         approval_threshold_minor: None,
//!         policy: None,
//!         network_retries_max: None,
//!         reconciliations_max: None,
//!     },
//!     versions: Default::default(),
//!     owner: None,
//! }));
//! // Outside an async runtime; async callers use `store.execute(command).await`.
//! let reply = store.execute_blocking(command)?;
//! assert!(matches!(reply, Reply::Run(_)));
//!
//! let reader = store.reader()?;
//! assert_eq!(reader.runs()?[0].status, "running");
//! assert!(reader.verify()?.is_ok());
//! store.shutdown()?;
//! # Ok(())
//! # }
//! ```
//!
//! # Ordering, group commit, shutdown and failure
//!
//! One dedicated thread owns the write connection and the ledger; every command reaches it
//! through one bounded channel, and it decides commands in arrival order, each against the
//! events of every command before it (including those of the same batch and those another
//! process committed: it catches up under `BEGIN IMMEDIATE` before deciding). Commands that
//! queue while a batch commits form the next batch: one transaction, one fsync, up to
//! `WRITER_BATCH_MAX` commands. Callers are answered only after the commit. A failed batch is
//! rolled back and its callers told `Unavailable` (with `maybe_committed` set when the
//! `COMMIT` itself failed); the writer re-folds the ledger from the file and goes on.
//! Shutdown — [`Store::shutdown`] or dropping the last handle — drains the queue and joins
//! the thread. The [`writer`] module documents each of these in detail.
//!
//! # Architecture invariant
//!
//! **Only this crate knows SQL.** Everything it writes is derived from
//! `engine::ledger::Ledger::decide`; it never decides anything itself.

mod cache;
mod chain;
mod checkpoint;
mod codec;
mod error;
pub mod keys;
mod leases;
pub mod metrics;
mod packed;
mod projection;
mod reader;
mod rebuild;
mod rows;
mod schema;
mod tx;
pub mod vault;
pub mod writer;

pub use codec::TYPES as EVENT_TYPES;
pub use error::{Error, Result};
pub use projection::{IntentRow, RunRow};
pub use reader::{Mismatch, Phase, Progress, Reader, RunFilter, RunState, VERIFY_MISMATCHES_MAX, VerifyReport};
pub use schema::{
    BUSY_TIMEOUT_DEFAULT_MS, Durability, MIGRATIONS, Migration, Options, SCHEMA_VERSION, WAL_AUTOCHECKPOINT_PAGES,
    WRITE_LOCK_PATIENCE_MS,
};
pub use writer::{Store, WriterStats};
