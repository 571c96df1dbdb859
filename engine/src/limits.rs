//! Every bound Keel enforces, in one place.
//!
//! Each constant says why it has its value and where it is enforced. Relations between
//! them are checked at compile time. Units come last in the name. Nothing here is read from
//! the environment: the binary may override the *defaults* through flags, never the caps.

/// Default attempts per intent, the first one included. Enforced by `Ledger::decide` on
/// `StartAttempt`. Three lets an intent survive two proven-absent resends before it escalates.
pub const ATTEMPTS_PER_INTENT_DEFAULT: u32 = 3;

/// Default reconciliations per intent before it escalates. Enforced by `Ledger::decide` on
/// `StartReconciliation`. Five lookups spaced by the backoff cover a provider outage of
/// several seconds in the demo and minutes in production settings.
pub const RECONCILIATIONS_PER_INTENT_DEFAULT: u32 = 5;

/// First delay before reconciling an unknown outcome. Doubles per reconciliation up to
/// [`RECONCILE_BACKOFF_MAX_MS`]. Enforced where `reconcile_after` is computed (ledger).
pub const RECONCILE_BACKOFF_BASE_MS: u64 = 1_000;

/// Cap of the reconciliation backoff.
pub const RECONCILE_BACKOFF_MAX_MS: u64 = 60_000;

/// Time an effect needs after it is sent for Keel to reconcile it before the run's deadline:
/// an effect is not started when less is left. Enforced on `StartAttempt`.
pub const RECONCILIATION_RESERVE_MS: u64 = 2_000;

/// Default run deadline, from run start.
pub const RUN_DEADLINE_DEFAULT_MS: u64 = 120_000;

/// Default approval validity.
pub const APPROVAL_TTL_DEFAULT_MS: u64 = 3_600_000;

/// Maximum commands the store's writer folds into one SQLite transaction (group commit).
/// Large enough to amortise one fsync over many concurrent runs, small enough that a batch
/// commits in a few milliseconds. Enforced by the store's writer loop.
pub const WRITER_BATCH_MAX: usize = 512;

/// Capacity of the store's command channel. Bounded so a burst applies back-pressure on
/// callers instead of growing memory. Enforced where the store creates its channel.
pub const WRITER_CHANNEL_CAPACITY: usize = 4_096;

/// Largest JSON payload accepted for one event, in bytes. Checked before append.
pub const EVENT_PAYLOAD_MAX_BYTES: usize = 64 * 1024;

/// Intent ids are 12 to 120 characters (seed 004's input contract). Enforced by workflows.
pub const INTENT_ID_MIN_CHARS: usize = 12;
/// See [`INTENT_ID_MIN_CHARS`].
pub const INTENT_ID_MAX_CHARS: usize = 120;
/// Payment method tokens are at least 20 characters (seed 004). Enforced by workflows.
pub const PAYMENT_METHOD_TOKEN_MIN_CHARS: usize = 20;

/// Reconciliations `keel reconcile --due` runs in one pass, so a backlog cannot hold the
/// writer for long. Enforced by the executor's reconciliation pass.
pub const RECONCILE_PASS_MAX: usize = 1_000;

const _: () = assert!(RECONCILE_BACKOFF_BASE_MS <= RECONCILE_BACKOFF_MAX_MS);
const _: () = assert!(RECONCILIATION_RESERVE_MS < RUN_DEADLINE_DEFAULT_MS);
const _: () = assert!(WRITER_BATCH_MAX <= WRITER_CHANNEL_CAPACITY);
const _: () = assert!(INTENT_ID_MIN_CHARS < INTENT_ID_MAX_CHARS);
const _: () = assert!(ATTEMPTS_PER_INTENT_DEFAULT >= 1);

/// The backoff before reconciliation number `n` (1-based).
pub fn reconcile_backoff_ms(n: u32) -> u64 {
    let shift = n.saturating_sub(1).min(16);
    (RECONCILE_BACKOFF_BASE_MS << shift).min(RECONCILE_BACKOFF_MAX_MS)
}
