//! The store's operational errors: one enum, retryable kinds apart from permanent ones.

use rusqlite::ErrorCode;

/// What went wrong in the store.
///
/// Outcomes of payments are never errors here: a refused command is an
/// [`engine::log::LogError::Refused`]. This enum is for the log itself. Use
/// [`Error::is_retryable`] to tell the kinds a caller may simply try again from the ones that
/// need a human (a corrupt log, a newer schema) or a code fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another connection held the write lock past the busy timeout. Retryable.
    #[error("database busy: {detail}")]
    Busy {
        /// SQLite's message.
        detail: String,
    },
    /// A racing writer appended first: `UNIQUE(stream, stream_seq)` (or the global `seq`
    /// primary key) refused this append instead of letting the log fork. Retryable after
    /// catching up with the log.
    #[error("conflict on stream {stream}: this writer expected to append at {expected}, the log is already at {found}")]
    Conflict {
        /// The stream, or `*` for the global sequence.
        stream: String,
        /// The sequence this writer tried to append at.
        expected: u64,
        /// The last sequence already in the log.
        found: u64,
    },
    /// The log does not hold what was written: a broken hash chain, a gap, an undecodable
    /// payload. Permanent: run `keel verify` and restore from a backup.
    #[error("corrupt event log at seq {seq}: {detail}")]
    Corrupt {
        /// The first sequence found wrong (0 when not tied to one event).
        seq: u64,
        /// What is wrong with it.
        detail: String,
    },
    /// The database file was written by a newer Keel. Permanent for this binary.
    #[error("database schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew {
        /// `PRAGMA user_version` found.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The database has not been migrated to this build's schema yet (a reader cannot
    /// migrate; open it once with [`crate::Store::open`]).
    #[error("database schema version {found} is older than this build's ({supported}): open it with the writer first")]
    SchemaTooOld {
        /// `PRAGMA user_version` found.
        found: i64,
        /// The version this build needs.
        supported: i64,
    },
    /// An event's canonical payload is larger than `EVENT_PAYLOAD_MAX_BYTES`. Permanent for
    /// that command; nothing was written.
    #[error("{event_type} payload is {bytes} bytes, above the {max}-byte limit")]
    PayloadTooLarge {
        /// The event's type.
        event_type: &'static str,
        /// Its canonical size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The store was shut down (or its writer thread stopped).
    #[error("the store is closed")]
    Closed,
    /// The writer thread panicked: a bug (an impossible transition); the log is intact up to
    /// the last commit.
    #[error("the writer thread panicked: {detail}")]
    WriterPanicked {
        /// The panic message.
        detail: String,
    },
    /// The vault key given does not open this database's vault (another key set it up or
    /// rotated it). Permanent for that key; the message never quotes a key.
    #[error("vault key rejected: {detail}")]
    VaultKeyRejected {
        /// What is wrong.
        detail: String,
    },
    /// A vault maintenance command cannot be carried out (an entry that does not
    /// authenticate, no vault to rotate). Nothing was changed.
    #[error("vault: {detail}")]
    Vault {
        /// What is wrong.
        detail: String,
    },
    /// An API key with this name exists already (revoked keys keep theirs). Permanent: pick
    /// another name.
    #[error("an API key named {name:?} exists already (names are never reused, even once revoked)")]
    KeyNameTaken {
        /// The name asked for.
        name: String,
    },
    /// The operating system refused something (spawning the writer thread).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// Any other SQLite failure (I/O error, disk full, constraint other than the log's).
    #[error("sqlite: {0}")]
    Sqlite(#[source] rusqlite::Error),
}

impl Error {
    /// Whether trying the same operation again may succeed without anyone changing anything.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Busy { .. } | Self::Conflict { .. } => true,
            Self::Corrupt { .. }
            | Self::SchemaTooNew { .. }
            | Self::SchemaTooOld { .. }
            | Self::PayloadTooLarge { .. }
            | Self::Closed
            | Self::WriterPanicked { .. }
            | Self::VaultKeyRejected { .. }
            | Self::Vault { .. }
            | Self::KeyNameTaken { .. }
            | Self::Io(_)
            | Self::Sqlite(_) => false,
        }
    }

    pub(crate) fn corrupt(seq: u64, detail: impl Into<String>) -> Self {
        Self::Corrupt { seq, detail: detail.into() }
    }
}

impl From<rusqlite::Error> for Error {
    /// Lock contention becomes [`Error::Busy`]; everything else stays a SQLite error.
    /// Constraint violations on `events` are classified where the append knows its stream
    /// (see `codec::insert_event`), not here.
    fn from(error: rusqlite::Error) -> Self {
        match error.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Self::Busy { detail: error.to_string() },
            _ => Self::Sqlite(error),
        }
    }
}

/// Shorthand for the store's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
