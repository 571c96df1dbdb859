//! Keel's event log in PostgreSQL: the same store contract as the SQLite `store`, for many
//! workers on many machines sharing one log. With `store`, the only crates that name SQL.
//!
//! Main types:
//!
//! - [`PgLog`] — the cheap-to-clone handle on a pool of writer threads, each owning one
//!   connection. It implements [`engine::log::EventLog`]: each [`Command`](engine::ledger::Command)
//!   runs in its own savepoint of a READ COMMITTED transaction shared with the commands queued
//!   with it (group commit), takes the locks of the entities its decision reads, decides with
//!   `engine::ledger::decide`, appends, folds, writes the rows and is answered after the one
//!   `COMMIT` (see [`writer`](crate::writer) for failure and retries).
//! - [`PgReader`] — reads outside any command: a stream, an intent, a run, the whole-log
//!   [`Ledger`](engine::ledger::Ledger), and [`PgReader::verify`] ([`VerifyReport`]).
//! - [`Import`] — a log decided elsewhere (SQLite), copied in bounded batches, each event
//!   re-chained on its stream, resumable; [`Provenance`] says where a migrated log came from.
//! - [`Options`], [`Error`], [`schema::SCHEMA_VERSION`].
//! - [`admin`]: a fresh database on a log's server (what `keel bench` runs in).
//! - [`proxy`]: a TCP proxy that cuts connections mid-transaction and mid-`COMMIT`, for the
//!   conformance suite and `keel soak --store postgres://…` (never between Keel and an
//!   operator's database).
//!
//! The chain is per stream (`engine::append::Chaining::PerStream`): `store/FORMAT.md`
//! ("PostgreSQL") says what tamper evidence that keeps and what it does not.
//!
//! The `cluster` feature adds [`cluster`], a throwaway PostgreSQL for tests.

pub mod admin;
mod error;
pub mod import;
mod locks;
pub mod proxy;
mod reader;
mod rows;
pub mod schema;
mod tx;
pub mod writer;

#[cfg(feature = "cluster")]
pub mod cluster;

pub use error::{Error, Result};
pub use import::{Import, Provenance, Source, Start};
pub use reader::{Mismatch, PgReader, VERIFY_MISMATCHES_MAX, VerifyReport};
pub use writer::{Options, PgLog, WriterStats};

/// The key of the transaction-scoped advisory lock (`pg_advisory_xact_lock`) a command takes
/// before it reads `stream`'s entity: what an operator looks for in `pg_locks`, and what a
/// test holds to stop a command at that read.
pub fn stream_lock_key(stream: &engine::event::StreamId) -> i64 {
    locks::Lock::Stream(stream).key()
}
