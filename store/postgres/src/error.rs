//! The PostgreSQL store's operational errors: one enum, retryable kinds apart.
//!
//! Owns [`Error`] and the one place SQLSTATE codes are read ([`Error::retryable_code`]). A
//! refused command is never an error here: it is an [`engine::log::LogError::Refused`].

use postgres::error::SqlState;

/// What went wrong in the PostgreSQL store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// PostgreSQL (or the connection to it) failed.
    #[error("postgres: {0}")]
    Postgres(#[from] postgres::Error),
    /// A read inside the transaction saw an entity change after a range read had shown it
    /// without its lock: the command is run again (retryable).
    #[error("entity {stream} changed under this command after it was read unlocked")]
    Stale {
        /// The entity's stream.
        stream: String,
    },
    /// The log does not hold what was written: a broken chain, a row that does not decode.
    #[error("corrupt event log at seq {seq}: {detail}")]
    Corrupt {
        /// The first sequence found wrong (0 when not tied to one event).
        seq: u64,
        /// What is wrong.
        detail: String,
    },
    /// The database was migrated by a newer Keel.
    #[error("database schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew {
        /// The version found in `keel_meta`.
        found: i64,
        /// The newest this build knows.
        supported: i64,
    },
    /// A `COMMIT` whose answer was lost could not be looked up: whether it committed is
    /// unknown.
    #[error("cannot tell whether a commit happened: {0}")]
    CommitUnresolved(String),
    /// The writer pool is shut down.
    #[error("the store is closed")]
    Closed,
    /// A writer thread could not be started.
    #[error("could not start a writer thread: {0}")]
    Thread(#[from] std::io::Error),
    /// An import was asked into a log that already holds something else (nothing written).
    #[error("the target log is not empty ({what}): a migration only goes into an empty database")]
    NotEmpty {
        /// What it holds.
        what: String,
    },
    /// The log holds an unfinished import of another source (or of this one in another state).
    #[error(
        "the target holds an unfinished migration of another log (source head {}, {} events, {} copied)",
        found.source_head, found.source_events, found.copied_events
    )]
    OtherImport {
        /// The import found.
        found: Box<crate::import::Provenance>,
    },
    /// The log's import already finished: it is an ordinary log now.
    #[error(
        "the target already holds a finished migration (source head {}, {} events, finished {})",
        found.source_head, found.source_events, found.finished_at.map(|at| at.to_rfc3339()).unwrap_or_default()
    )]
    Imported {
        /// The import found.
        found: Box<crate::import::Provenance>,
    },
    /// The log is half imported: no writer may append before the import finishes.
    #[error("the log is a migration still unfinished ({} of {} events copied): run `keel migrate` again to finish it",
        found.copied_events, found.source_events)]
    ImportUnfinished {
        /// The import found.
        found: Box<crate::import::Provenance>,
    },
    /// An imported stream would break its chain, its numbering or its fold.
    #[error("import refused at seq {seq} on stream {stream}: {detail}")]
    ImportRefused {
        /// The event's sequence (0 when not tied to one).
        seq: u64,
        /// Its stream.
        stream: String,
        /// What is wrong.
        detail: String,
    },
    /// The options are out of their bounds.
    #[error("invalid options: {0}")]
    Options(String),
}

/// The store's result.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn corrupt(seq: u64, detail: impl Into<String>) -> Self {
        Self::Corrupt { seq, detail: detail.into() }
    }

    /// Whether running the whole command again may succeed: a deadlock, a serialization
    /// failure, a racing append to the same stream (`UNIQUE(stream, stream_seq)`), or an
    /// entity found stale.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Stale { .. } => true,
            Self::Postgres(error) => error.code().is_some_and(Self::retryable_code),
            _ => false,
        }
    }

    /// The SQLSTATEs after which a command's transaction is rolled back and run again.
    fn retryable_code(code: &SqlState) -> bool {
        [SqlState::T_R_DEADLOCK_DETECTED, SqlState::T_R_SERIALIZATION_FAILURE, SqlState::UNIQUE_VIOLATION]
            .contains(code)
    }

    /// Whether the connection itself failed (closed, or an I/O error on its socket): the
    /// server gave no answer, as opposed to answering with an error.
    pub(crate) fn is_connection(&self) -> bool {
        use std::error::Error as _;
        match self {
            Self::Postgres(error) => {
                error.is_closed() || error.source().is_some_and(|source| source.is::<std::io::Error>())
            }
            _ => false,
        }
    }
}
