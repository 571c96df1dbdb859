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

/// Default run deadline, from run start.
pub const RUN_DEADLINE_DEFAULT_MS: u64 = 120_000;

/// Default money one workflow run may move, in minor units: 10^7 (one hundred thousand of a
/// two-decimal currency). A run is bounded in money even when neither the operator's policy
/// nor the caller names a budget; an operator who moves more per run says so in the policy
/// (`run_budget_minor`). Recorded in `RunStarted.limits.cost_minor_max`; enforced by
/// `Ledger::decide` on `Reserve` (`budget_exhausted`).
pub const RUN_COST_DEFAULT_MINOR: i64 = 10_000_000;

/// Default largest amount of one charge or refund, in minor units, when the operator's
/// policy names none (the built-in policy): the default run budget, so one effect may spend
/// a default run's whole budget and no more. Enforced by the charge and refund workflows
/// (`policy_denied`).
pub const EFFECT_AMOUNT_DEFAULT_MAX_MINOR: i64 = RUN_COST_DEFAULT_MINOR;

/// Largest policy file the binary reads (`--policy`, `keel.toml`): a policy with
/// [`POLICY_TENANTS_MAX`] tenant sections fits in a few hundred KiB. Enforced by the binary.
pub const POLICY_FILE_MAX_BYTES: u64 = 1 << 20;

/// Largest vault key file the binary reads (`--vault-key-file`, `keel vault rotate
/// --new-key-file`): a key is 44 base64 characters; the rest is room for a newline and
/// spaces. Enforced by the binary through [`read_at_most`].
pub const VAULT_KEY_FILE_MAX_BYTES: u64 = 4 * 1024;

/// Largest request the binary reads from `--input FILE|-` (a charge or refund as JSON) or
/// `keel facts decide --candidates FILE|-`: what it holds becomes one event's payload, so four
/// times [`EVENT_PAYLOAD_MAX_BYTES`] leaves room for indentation and the event's own bound
/// then applies. Enforced by the binary through [`read_at_most`].
pub const REQUEST_FILE_MAX_BYTES: u64 = 256 * 1024;

/// Largest support ticket file the binary reads (`keel agent run --ticket`): a ticket's text
/// is at most [`SUPPORT_TICKET_TEXT_MAX_BYTES`]; the rest is room for its order and JSON.
/// Enforced by the binary through [`read_at_most`].
pub const TICKET_FILE_MAX_BYTES: u64 = 64 * 1024;

/// Largest model transcript read (`keel agent run --transcript`, the scripted transport): a
/// run makes at most [`AGENT_MODEL_CALLS_MAX`] calls of at most [`AGENT_ANSWER_MAX_BYTES`]
/// each, about 48 MiB; a transcript longer than that cannot be played to its end. Enforced by
/// `adapters::model::Transcript::from_file` through [`read_at_most`].
pub const TRANSCRIPT_FILE_MAX_BYTES: u64 = 64 << 20;

/// Largest PEM file `keel serve --tls-cert`/`--tls-key` reads: a chain of a few certificates
/// and a key are a few KiB. Enforced by the binary through [`read_at_most`].
pub const TLS_PEM_FILE_MAX_BYTES: u64 = 1 << 20;

/// Largest fault plan the simulator reads (`keel-provider-sim serve --faults`): a plan is a
/// handful of rules. Enforced by `FaultPlan::load` through [`read_at_most`].
pub const FAULT_PLAN_FILE_MAX_BYTES: u64 = 1 << 20;

/// Reads `reader` to its end when it holds at most `max_bytes`, and refuses it otherwise: it
/// reads one byte past the bound and never the rest, so `/dev/zero`, a FIFO or a file that
/// grows ends the read at once (a length from metadata is not trusted: devices and FIFOs have
/// none). Every file Keel is handed is read through it or [`read_text_at_most`], each kind with
/// its bound above (and [`POLICY_FILE_MAX_BYTES`]). The caller opens the file and names it in
/// its message: this does no I/O of its own, it only drives the reader it is given.
///
/// # Errors
///
/// The reader's, or one of kind [`std::io::ErrorKind::FileTooLarge`] saying the bound.
pub fn read_at_most(reader: impl std::io::Read, max_bytes: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    reader.take(max_bytes.saturating_add(1)).read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).map_or(true, |read| read > max_bytes) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("it holds more than {max_bytes} bytes, the most read from such a file"),
        ));
    }
    Ok(bytes)
}

/// [`read_at_most`], as UTF-8 text.
///
/// # Errors
///
/// [`read_at_most`]'s, or one of kind [`std::io::ErrorKind::InvalidData`] for bytes that are
/// not UTF-8.
pub fn read_text_at_most(reader: impl std::io::Read, max_bytes: u64) -> std::io::Result<String> {
    String::from_utf8(read_at_most(reader, max_bytes)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "it is not UTF-8 text"))
}

/// The highest request rate a provider may be declared to take (`--provider-rate-per-s`):
/// Stripe's own live-mode limit is in the hundreds a second; ten thousand is past any real one.
pub const PROVIDER_RATE_PER_S_MAX: u32 = 10_000;

/// How much wider than `1 / rate` the spacing between two requests to a rate-limited provider
/// is (`adapters::flow::RateLimited`, `--provider-rate-per-s`): a provider counts requests
/// when they arrive, and the network's jitter can bring two closer than they left; two per
/// cent keeps any second at the provider within its declared rate.
pub const FLOW_SPACING_MARGIN: f64 = 1.02;

/// Longest release name (`KEEL_RELEASE`): it is recorded on every run and is a metrics label.
/// Enforced by the binary's start.
pub const RELEASE_NAME_MAX_CHARS: usize = 64;

/// Fewest intents (or runs, for a rate over runs) each of two versions needs before `keel
/// metrics` calls a move of a rate between them a drift: below it a rate is one or two
/// outcomes, not a tendency. Enforced by `metrics::drifts`.
pub const DRIFT_SAMPLE_MIN: u64 = 3;

/// How many points (0.10: ten percentage points) a proportion must move between two versions
/// to be a drift. Enforced by `metrics::drifts`.
pub const DRIFT_RATE_POINTS: f64 = 0.10;

/// What share (0.25: a quarter) a cost per validated intent must move by between two versions
/// to be a drift. Enforced by `metrics::drifts`.
pub const DRIFT_COST_SHARE: f64 = 0.25;

/// Most tenant sections in one policy, so resolving a policy stays a small map lookup and a
/// policy file stays reviewable. Enforced by `Policy::from_document`.
pub const POLICY_TENANTS_MAX: usize = 10_000;

/// Longest policy version: it is recorded on every run. Enforced by `Policy::from_document`.
pub const POLICY_VERSION_MAX_CHARS: usize = 64;

/// Most controlled facts in one batch and in one conversation (seed 001: five). A new key
/// past it evicts the fact of the oldest turn. Enforced by `facts::Conversation::admit`.
pub const FACTS_MAX: usize = 5;

/// Longest fact value, in characters (seed 001). Enforced by `facts::Conversation::admit`.
pub const FACTS_VALUE_MAX_CHARS: usize = 256;

/// Longest fact evidence (the quote of the user's message), in characters (seed 001).
/// Enforced by `facts::Conversation::admit`.
pub const FACTS_EVIDENCE_MAX_CHARS: usize = 512;

/// Longest user message facts are extracted from, in characters (seed 001). Enforced by
/// `facts::Conversation::admit`.
pub const FACTS_MESSAGE_MAX_CHARS: usize = 4_096;

/// Longest conversation id: it names a stream. Enforced by `facts::ConversationId::parse`.
pub const FACTS_CONVERSATION_ID_MAX_CHARS: usize = 128;

/// How long a run's lease lasts unless its holder renews it (see `engine::lease`). A holder
/// renews at a third of it, so two missed renewals — a long GC-free pause, a slow disk — do
/// not cost it the run; a process that died on another machine is taken over after at most
/// this long (on the same machine, a dead holder is proven dead at once). Enforced by the
/// ledger's claim rule; the binary may lower it for tests (`--lease-ttl-ms`).
pub const LEASE_TTL_DEFAULT_MS: u64 = 30_000;

/// The shortest lease the binary accepts: below it a renewal loop could not keep up with
/// the writer's own commit latency under load.
pub const LEASE_TTL_MIN_MS: u64 = 300;

/// The longest lease: a dead holder on another machine blocks its runs at most this long.
pub const LEASE_TTL_MAX_MS: u64 = 600_000;

/// How often a process waiting for another one to let go of a run (a second `keel agent
/// resume` of the same run) asks again. Short against a human's patience, long against the
/// writer's commit latency.
pub const LEASE_POLL_MS: u64 = 200;

/// How long a second `keel agent resume` of a run waits for the first one to finish or
/// suspend it before it gives up, saying who holds the run. Ten minutes covers a model call
/// and a provider call at their own timeouts several times over.
pub const AGENT_RESUME_WAIT_MAX_MS: u64 = 600_000;

/// How long a `keel` command stopped by SIGTERM lets its step in progress finish (an
/// attempt at the provider waits at most its request timeout, 5 s by default) before the
/// process exits.
pub const SHUTDOWN_GRACE_MS: u64 = 10_000;

/// The longest wait a workflow's durable timer (`Context::sleep`) spends asleep in its
/// process. A longer one suspends the run instead: its fire time is already durable
/// (`TimerStarted`), so `keel resume` (and any resume pass sharing its path) continues it at
/// or after that instant, and no process stays blocked for hours holding a lease. A wait this short
/// costs less asleep than a suspension does (a lease given back, a resume pass, a replay),
/// and a process that dies during it is resumed like any other crash — its fire time is
/// durable either way. Enforced by `Context::sleep`.
pub const TIMER_IN_PROCESS_MAX_MS: u64 = 1_000;

/// Longest signal name (`keel signal RUN_ID NAME`): it is a journal step's name
/// (`signal:NAME`) that replay compares. Enforced by the ledger's `DeliverSignal`.
pub const SIGNAL_NAME_MAX_CHARS: usize = 64;

/// Largest signal payload, as canonical JSON: it is recorded twice (its `SignalDelivered`,
/// then the journal step that consumes it), each within one event
/// ([`EVENT_PAYLOAD_MAX_BYTES`]). Enforced by the ledger's `DeliverSignal`; the binary
/// refuses a larger `--payload` text before parsing it.
pub const SIGNAL_PAYLOAD_MAX_BYTES: usize = 16 * 1024;
/// Units of work a `keel worker` carries out at once when `--concurrency` is not given: a
/// unit mostly waits on the provider (a request, a lookup), so a few in parallel hide that
/// latency, while the store's one writer stays far from saturated. Enforced by the binary's
/// worker loop.
pub const WORKER_CONCURRENCY_DEFAULT: usize = 4;

/// Most units of work one `keel worker` carries out at once (`--concurrency` above it is a
/// usage error): each holds a run's lease, a provider connection and, for an agent run, a
/// store connection of its own; past 64 the SQLite writer is saturated (`keel bench` at
/// C=64), so more only holds leases other workers could use.
pub const WORKER_CONCURRENCY_MAX: usize = 64;

/// How long a `keel worker` waits between two passes over the due work when `--poll-ms` is
/// not given. A pass replays every unfinished run nobody holds (claims and releases append
/// no event, so an idle worker never grows the log); one second keeps a takeover within a
/// second of a lease's expiry without keeping the writer busy.
pub const WORKER_POLL_DEFAULT_MS: u64 = 1_000;

/// Shortest `--poll-ms`: below it an idle worker's snapshots would compete with real work
/// for the writer.
pub const WORKER_POLL_MIN_MS: u64 = 10;

/// Longest `--poll-ms`: a pass at least every ten minutes, so due work never waits longer.
pub const WORKER_POLL_MAX_MS: u64 = 600_000;

/// How often a `keel worker` prints its health line when `--health-ms` is not given.
pub const WORKER_HEALTH_DEFAULT_MS: u64 = 10_000;

/// Shortest `--health-ms`, so the health line stays a line per interval, not a stream.
pub const WORKER_HEALTH_MIN_MS: u64 = 100;

/// Longest `--grace-ms` a stopping `keel worker` gives its work in flight: past ten minutes
/// a supervisor's own stop timeout has long killed it.
pub const WORKER_GRACE_MAX_MS: u64 = 600_000;

/// Default approval validity.
pub const APPROVAL_TTL_DEFAULT_MS: u64 = 3_600_000;

/// Maximum commands the store's writer folds into one SQLite transaction (group commit).
/// Large enough to amortise one fsync over many concurrent runs, small enough that a batch
/// commits in a few milliseconds. Enforced by the store's writer loop.
pub const WRITER_BATCH_MAX: usize = 512;

/// Capacity of the store's command channel. Bounded so a burst applies back-pressure on
/// callers instead of growing memory. Enforced where the store creates its channel.
pub const WRITER_CHANNEL_CAPACITY: usize = 4_096;

/// Default writer threads of the PostgreSQL store, each owning one connection and running one
/// transaction (a batch of commands) at a time: commands on different entities commit
/// concurrently, up to this many transactions at once, without opening more connections than a small server allows per
/// process. Enforced where `store_postgres::PgLog` starts its pool; its options may change it
/// within [`PG_WRITERS_MAX`].
pub const PG_WRITERS_DEFAULT: usize = 8;

/// Most writer threads (and connections) one PostgreSQL store opens: PostgreSQL's default
/// `max_connections` is 100, shared by every worker process of a deployment.
pub const PG_WRITERS_MAX: usize = 64;

/// Most commands one PostgreSQL writer thread runs in one transaction (group commit): each in
/// its own savepoint, one `COMMIT` (one WAL flush, one commit id) for all. Commands queue
/// while a thread waits on its server, so under load a batch fills without waiting for more.
/// Bounded by PostgreSQL's subtransaction cache: a server process keeps the ids of at most 64
/// subtransactions that wrote in shared memory (`PGPROC_MAX_CACHED_SUBXIDS`); past that,
/// every other session's snapshot consults `pg_subtrans` on disk. Half of it leaves room and
/// still spreads one flush over 32 commands. Enforced by `store_postgres::PgLog`'s writer loop.
pub const PG_BATCH_COMMANDS_MAX: usize = 32;

/// Times the PostgreSQL store runs one command before it answers with an error: a deadlock
/// (40P01), a serialization failure (40001), a racing append to the same stream (23505 on
/// `events`) or a dropped connection rolls the command back (to its savepoint, or with its
/// whole batch) and runs it again in the writer's next transaction. Sixteen outlasts a burst of workers colliding on one hot entity. Enforced by the
/// store's writer threads.
pub const PG_COMMAND_ATTEMPTS_MAX: u32 = 16;

/// Longest pause before a retried PostgreSQL command, in ms: the pause is jittered in
/// `[0, min(2^attempt, this)]` so colliding workers do not collide again in step.
pub const PG_RETRY_BACKOFF_MAX_MS: u64 = 50;

/// How long the PostgreSQL store waits, in ms, for the server process of a connection whose
/// `COMMIT` answer was lost to end before it asks whether the commit happened; past it, that
/// process is terminated and waited for again. Enforced by the store's commit resolution.
pub const PG_COMMIT_RESOLVE_WAIT_MS: u64 = 5_000;

/// Events one batch of an import into PostgreSQL (`keel migrate`) gathers before it commits:
/// large enough that a commit's round trips are a small share of the copy, small enough that
/// a batch's rows (a few KiB each) stay a few MiB in memory and an interrupted import redoes
/// little. A stream is never split, so a batch holds at most this plus one stream. Enforced
/// by `store_postgres::Import::push_stream`.
pub const PG_IMPORT_BATCH_EVENTS: usize = 2_000;

const _: () = assert!(PG_WRITERS_DEFAULT <= PG_WRITERS_MAX);
const _: () = assert!(PG_COMMAND_ATTEMPTS_MAX >= 2);
// One savepoint per command: a full batch stays within the server's 64 cached subtransactions.
const _: () = assert!(PG_BATCH_COMMANDS_MAX >= 1 && PG_BATCH_COMMANDS_MAX <= 64);
const _: () = assert!(PG_BATCH_COMMANDS_MAX <= WRITER_CHANNEL_CAPACITY);

/// Entities (intents and runs) the store's writer keeps decoded in memory between commands,
/// and stream ids it remembers. A command reads the few entities it is about; a hot set of
/// this size serves a workload's in-flight intents and their runs without re-reading rows,
/// and bounds the writer's memory whatever the log's size (an entity is one to two KiB
/// decoded: at most about 16 MiB). Enforced by the store's cache, which drops the least
/// recently used half when full.
pub const ENTITY_CACHE_MAX: usize = 8_192;

/// Events a writer appends (or checks) before it records them as verified in the log
/// (`meta.verified_seq`), besides at shutdown. `Store::open` checks only the events after
/// that point, so after a crash an open re-checks at most this many events plus one batch
/// (a few tens of milliseconds); recording costs one page per this many events. Enforced by
/// the store's writer.
pub const VERIFIED_MARK_EVENTS: u64 = 2_048;

/// Events a writer commits before it asks its checkpointer to copy the WAL into the
/// database file. A checkpoint writes every page the commits since the last one dirtied and
/// fsyncs the file: asked after every commit, it cost a second and third fsync per commit
/// and rewrote the same hot pages commit after commit (at one caller the checkpointer took
/// a third of the process's samples). The WAL grows by at most this many events' pages
/// between checkpoints (SQLite's own `wal_autocheckpoint` stays the bound if the
/// checkpointer falls behind). Enforced by the store's writer.
pub const CHECKPOINT_NUDGE_EVENTS: u64 = 256;

/// Largest JSON payload accepted for one event, in bytes. Checked before append.
pub const EVENT_PAYLOAD_MAX_BYTES: usize = 64 * 1024;

/// Deepest nesting of arrays and objects `engine::canonical::parse_strict` reads. Keel's own
/// documents nest at most a handful of levels; 64 leaves room for any honest caller's input
/// and stops a hostile one from making a reader recurse without bound.
pub const JSON_DEPTH_MAX: usize = 64;

/// Intent ids are 12 to 120 characters (seed 004's input contract). Enforced by workflows.
pub const INTENT_ID_MIN_CHARS: usize = 12;
/// See [`INTENT_ID_MIN_CHARS`].
pub const INTENT_ID_MAX_CHARS: usize = 120;
/// Order ids are 1 to 256 visible ASCII characters: enough for any provider's order
/// reference, short enough to sit in one event and one header. Enforced by workflows.
pub const ORDER_ID_MAX_CHARS: usize = 256;
/// Longest payment method token: Stripe's bound on its object ids (a PaymentMethod id, `pm_…`,
/// is one). A token's shape is the provider's (`pm_` then letters, digits and `_`), not a length
/// picked here: Stripe's test ids (`pm_card_visa`) are 12 characters. Enforced by workflows.
pub const PAYMENT_METHOD_TOKEN_MAX_CHARS: usize = 255;

/// Largest amount one charge or refund may move, in minor units: 10^12 (ten billion of a
/// two-decimal currency, a trillion XOF). Far above any single card payment (Stripe caps most
/// currencies at 99 999 999), and small enough that nine million maximal amounts still sum
/// inside `i64`. Enforced at input (workflows' field validation: `invalid_arguments`) and again
/// by `Ledger::decide` on `Reserve`, so no caller of the engine's API can go around it; the
/// ledger's sums are checked on top of it.
pub const AMOUNT_MINOR_MAX: i64 = 1_000_000_000_000;

/// Network retries a run may make (the SPEC's "network retries", attempts beyond the first):
/// attempts started again after one proven never sent (connection refused, DNS failure, a
/// request that could not be built). Such an attempt made no effect, so it does not spend
/// [`ATTEMPTS_PER_INTENT_DEFAULT`]'s bound; this one bounds how long a run keeps knocking. Three,
/// with [`network_retry_backoff_ms`] between them, rides out a provider restarting for about a
/// second. Enforced by `Ledger::decide` on `StartAttempt`; past it the intent stays reserved
/// and a new submission of the same request continues it.
pub const NETWORK_RETRIES_PER_RUN_MAX: u32 = 3;

/// Most network retries a caller may give one run (`--max-network-retries`). Enforced by the
/// binary (usage error 64).
pub const NETWORK_RETRIES_PER_RUN_LIMIT: u32 = 100;

/// Default automatic reconciliations one run's intents may make together: four intents'
/// worth of [`RECONCILIATIONS_PER_INTENT_DEFAULT`]. A run whose provider keeps answering
/// "unavailable" across many intents stops spending lookups; past it an intent still unknown
/// escalates (`reconciliation budget`). Recorded in `RunStarted.limits.reconciliations_max`;
/// enforced by `Ledger::decide` on `StartReconciliation` (not on an operator's forced one).
pub const RECONCILIATIONS_PER_RUN_DEFAULT: u32 = 4 * RECONCILIATIONS_PER_INTENT_DEFAULT;

/// Most automatic reconciliations a caller may give one run (`--max-run-reconciliations`).
/// Enforced by the binary (usage error 64).
pub const RECONCILIATIONS_PER_RUN_LIMIT: u32 = 10_000;

/// First wait before a network retry; doubles per retry up to [`NETWORK_RETRY_BACKOFF_MAX_MS`].
/// Enforced by the executor's intent driver, which waits through the `Clock`.
pub const NETWORK_RETRY_BACKOFF_BASE_MS: u64 = 100;

/// Cap of the network-retry backoff.
pub const NETWORK_RETRY_BACKOFF_MAX_MS: u64 = 1_000;

/// Longest run deadline a caller may ask for: 30 days. A run holds its money while it lives,
/// and a deadline is an absolute instant that must stay representable. Enforced by the binary
/// (`--deadline-ms`, usage error 64) and by `Executor::start`.
pub const RUN_DEADLINE_MAX_MS: u64 = 30 * 24 * 60 * 60 * 1_000;

/// Longest approval validity: 30 days. An approval is bound to a fingerprint and must go
/// stale; its expiry must stay a representable instant. Enforced by the binary (`--ttl-ms`,
/// usage error 64) and by `Ledger::decide` on `Approve` (a refusal past any date).
pub const APPROVAL_TTL_MAX_MS: u64 = 30 * 24 * 60 * 60 * 1_000;

/// Longest provider request timeout or consistency window an operator may declare: one hour.
/// A resend after "absent" waits for both, so past this an intent would never be resent in a
/// run's lifetime. Enforced by the binary (`--provider-timeout-ms`,
/// `--provider-consistency-window-ms`, usage error 64).
pub const PROVIDER_WAIT_MAX_MS: u64 = 60 * 60 * 1_000;

/// How long a charge may wait for its caller — ready for its next attempt, but with no
/// payment method at hand (no vault, or an entry that cannot be used) — before Keel ends it:
/// rejected `abandoned` when its effect is proven absent or it was never sent, escalated
/// otherwise. 24 hours, Stripe's idempotency key window: past it a resend with the same key
/// would no longer be deduplicated, so a caller coming back later could not be served
/// safely anyway. Counted from the latest attempt's send (from the run's start if it was
/// never sent). Enforced by `Ledger::decide` on `Abandon` and applied by the executor's
/// reconciliation pass (`keel resume`, `keel reconcile --due`); the binary's
/// `--abandon-waiting-after` overrides it, up to [`ABANDON_AFTER_MAX_MS`].
pub const ABANDON_AFTER_DEFAULT_MS: u64 = 24 * 60 * 60 * 1_000;

/// Longest abandonment window an operator may set: 30 days, like a run's deadline — an
/// intent that waits longer holds its money for nothing. Enforced by the binary (usage
/// error 64).
pub const ABANDON_AFTER_MAX_MS: u64 = 30 * 24 * 60 * 60 * 1_000;

/// Intents waiting for their caller that one reconciliation pass looks at (sends with the
/// vault's payment method, or ends past the abandonment window), so a backlog cannot hold
/// the writer for long. Enforced by the executor's reconciliation pass.
pub const WAITING_PASS_MAX: usize = 1_000;

/// Reconciliations `keel reconcile --due` runs in one pass, so a backlog cannot hold the
/// writer for long. Enforced by the executor's reconciliation pass.
pub const RECONCILE_PASS_MAX: usize = 1_000;

/// Unfinished runs one `keel resume` pass replays. A backlog larger than this is taken in
/// several passes, so one pass's memory and time stay bounded. Enforced by the ledger's
/// snapshot (`Action::Snapshot`).
pub const RESUME_PASS_MAX: usize = 1_000;

/// Attempts and lookups in flight one recovery command declares interrupted, in one commit.
/// Ten thousand `OutcomeUnknown` events commit in well under a second; a larger backlog is
/// recovered in several passes. Enforced by the ledger's `Recover`.
pub const RECOVERY_PASS_MAX: usize = 10_000;

/// Shortest piece of a secret `Secret::scrub` removes from the cut end of a text (an error
/// excerpt cut in the middle of an echoed key or card token). Shorter pieces say nothing
/// about the secret and would only blank ordinary words. Enforced by `Secret::scrub`.
pub const SECRET_PIECE_MIN_CHARS: usize = 4;

// ---------------------------------------------------------------------------------------------
// `keel serve`: the HTTP API's door. Enforced by the binary's `serve` module before anything
// reaches the executor; a request refused here writes nothing.
// ---------------------------------------------------------------------------------------------

/// Largest request body `keel serve` reads, in bytes. A charge or an operator decision is a
/// few hundred bytes; 16 KiB leaves room for long ids and reasons and stops a client from
/// making the server buffer megabytes (413 `body_too_large`). JSON nesting is bounded by
/// [`JSON_DEPTH_MAX`] (the same strict reader as every other door).
pub const API_BODY_MAX_BYTES: usize = 16 * 1024;

/// Intents one `GET /v1/intents` page holds when the caller names no `limit`.
pub const API_PAGE_LIMIT_DEFAULT: usize = 100;

/// Most intents one page may hold (`limit` above is refused 400): a page is read and
/// rendered in one request.
pub const API_PAGE_LIMIT_MAX: usize = 1_000;

/// Default sustained requests per second one API key may make (a token bucket refilled at
/// this rate; past it 429 with `Retry-After`). Enough for a service's steady traffic; one
/// runaway client cannot starve the writer for the others. The binary may change it
/// (`keel serve --rate-per-s`), up to [`API_RATE_PER_S_MAX`].
pub const API_RATE_PER_S_DEFAULT: u32 = 200;

/// Highest per-key rate the binary accepts (`--rate-per-s`): beyond the writer's own capacity
/// a limit limits nothing.
pub const API_RATE_PER_S_MAX: u32 = 1_000_000;

/// Burst of a key's token bucket, in seconds of its rate: a client may send two seconds'
/// worth at once after a quiet spell.
pub const API_RATE_BURST_S: u32 = 2;

/// Most token buckets one limiter holds (`keel serve`'s per-key buckets, the console's login
/// buckets per client address and per presented key id): past it the buckets full again are
/// dropped (one is as good as none), and while none is, a new caller is refused (429) rather
/// than memory growing with every address or id a flood presents.
pub const RATE_BUCKETS_MAX: usize = 10_000;

/// Console login attempts a minute, sustained, per client address and per presented key id
/// (past it 429 with `Retry-After`): a person pastes a key a few times; a guesser is slowed to
/// this, whichever addresses or ids it spreads over.
pub const CONSOLE_LOGINS_PER_MIN: u32 = 10;

/// Login attempts at once after a quiet spell, per client address and per key id.
pub const CONSOLE_LOGIN_BURST: u32 = 5;

/// `Retry-After` of a 202 whose intent is in flight (reserved, attempting, reconciling) and
/// has no reconciliation instant: the provider usually answers within a second.
pub const API_RETRY_AFTER_IN_FLIGHT_S: u64 = 1;

/// `Retry-After` of a 202 whose intent waits for a human (awaiting approval, escalated): a
/// person answers in minutes, not milliseconds.
pub const API_RETRY_AFTER_HUMAN_S: u64 = 60;

/// Longest API key name (`keel keys create --name`): recorded in the cause of every event its
/// requests write, so it stays short.
pub const API_KEY_NAME_MAX_CHARS: usize = 64;

// ---------------------------------------------------------------------------------------------
// OTLP export of the tracing spans (`OTEL_EXPORTER_OTLP_ENDPOINT`). Enforced by the binary's
// `telemetry` module: exporting runs on its own thread and never waits on an effect's path.
// ---------------------------------------------------------------------------------------------

/// Finished spans waiting for export, at most. A span that finds the queue full is dropped,
/// never waited for: a slow or dead collector costs spans, not time. A charge makes about
/// five spans; 2 048 (the OpenTelemetry default) holds hundreds of runs between two exports.
pub const OTLP_QUEUE_SPANS_MAX: usize = 2_048;

/// Spans in one export request (the OpenTelemetry default): a few hundred kilobytes at most.
pub const OTLP_BATCH_SPANS_MAX: usize = 512;

/// How long a finished span waits before its batch is sent when the batch is not full: short
/// enough that a trace shows up while an operator looks, long enough to send few requests.
pub const OTLP_EXPORT_DELAY_MS: u64 = 1_000;

/// One export request's whole time (connect, send, answer): a collector on the same network
/// answers in milliseconds; past this the batch is given up.
pub const OTLP_EXPORT_TIMEOUT_MS: u64 = 2_000;

/// How long a process waits at exit for its last spans to be exported: the flush is bounded,
/// so a dead or silent collector delays an exit by this at the most.
pub const OTLP_SHUTDOWN_MS: u64 = 3_000;

const _: () = assert!(OTLP_BATCH_SPANS_MAX <= OTLP_QUEUE_SPANS_MAX);
// The flush at exit lets one export in progress finish.
const _: () = assert!(OTLP_EXPORT_TIMEOUT_MS < OTLP_SHUTDOWN_MS);

/// How long a console session lasts from its login, in milliseconds: a working day. Past
/// it the operator logs in again (the key is also re-checked on every request, so a revoked
/// key's session ends at its next page). Enforced by `serve::console::session`.
pub const CONSOLE_SESSION_TTL_MS: u64 = 8 * 3_600_000;

/// How long a login form's session (no key yet, only its CSRF token) lasts: ten minutes to
/// paste a key. It is signed, not stored, so no number of them fills the session table.
pub const CONSOLE_LOGIN_TTL_MS: u64 = 10 * 60_000;

/// Most signed-in console sessions held at once: each is a few hundred bytes, and only a
/// successful login (rate-limited) makes one. When full, expired ones go first, then the one
/// expiring soonest. Login forms are not held (`serve::console::session`).
pub const CONSOLE_SESSIONS_MAX: usize = 10_000;

/// Intents one state's section of the console's intents page lists (the count shows them
/// all; the API pages through the rest).
pub const CONSOLE_LIST_MAX: usize = 50;

/// How long `keel serve` waits for a request's whole header block, and for the next request
/// on an idle kept-alive connection: a client that sends part of its headers and stops (or
/// sends nothing) is closed after this. Ten seconds is far above what any client on a
/// working network needs to send a few hundred bytes, and short enough that idle sockets
/// cannot hold the server's connection slots for long. Enforced by `serve::listen` (hyper's
/// header read timeout, which also runs while a kept-alive connection waits), on plain HTTP
/// and TLS alike.
pub const API_HEADER_READ_TIMEOUT_MS: u64 = 10_000;

/// How often `keel serve` reconciles the intents due for it in the background: an unknown
/// outcome settles while its caller only reads it. A reconciliation's own backoff starts at
/// [`RECONCILE_BACKOFF_BASE_MS`], so looking more often would find nothing more due.
/// Enforced by `serve::reconcile_in_background`.
pub const API_RECONCILE_EVERY_MS: u64 = RECONCILE_BACKOFF_BASE_MS;

/// How long `keel serve` waits for a TLS client to finish its handshake. A handshake is a
/// few round trips; a client that opens a socket and says nothing is closed after this.
/// Enforced by `serve::listen`.
pub const API_TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// How long `keel serve` waits for a request's whole body once its headers are in (at most
/// `API_BODY_MAX_BYTES`): a client that trickles its body is answered 408 and closed.
/// Enforced by `serve::body`.
pub const API_BODY_READ_TIMEOUT_MS: u64 = 10_000;

/// The most connections `keel serve` holds open at once, on plain HTTP and TLS alike. Below
/// it the bound is also kept under the process's descriptor limit (raised to its hard limit
/// at start): `serve::listen` keeps a quarter of the descriptors, at least
/// [`API_DESCRIPTORS_RESERVED`], for the log, its readers and the provider's connections.
/// At the bound, the connection idle the longest (no request in flight) is closed to make
/// room, so idle sockets can never lock a caller out.
pub const API_CONNECTIONS_MAX: usize = 4_096;

/// Descriptors `keel serve` never hands to client connections (see [`API_CONNECTIONS_MAX`]):
/// the log and its WAL, a reader's three files per pooled connection, the provider client's
/// sockets, standard streams.
pub const API_DESCRIPTORS_RESERVED: u64 = 32;

/// The first and the longest pause after `accept` fails (out of descriptors, out of memory,
/// a connection reset before it was taken): the error is logged and accepting resumes after
/// a pause doubling from the first to the longest, so a failing `accept` never ends the
/// server and never spins. Enforced by `serve::listen`.
pub const API_ACCEPT_BACKOFF_FIRST_MS: u64 = 5;
/// See [`API_ACCEPT_BACKOFF_FIRST_MS`].
pub const API_ACCEPT_BACKOFF_MAX_MS: u64 = 1_000;

const _: () = assert!(CONSOLE_LOGIN_TTL_MS < CONSOLE_SESSION_TTL_MS);
const _: () = assert!(API_ACCEPT_BACKOFF_FIRST_MS <= API_ACCEPT_BACKOFF_MAX_MS);
const _: () = assert!(CONSOLE_LIST_MAX <= API_PAGE_LIMIT_MAX);
const _: () = assert!(API_PAGE_LIMIT_DEFAULT <= API_PAGE_LIMIT_MAX);
const _: () = assert!(API_RATE_PER_S_DEFAULT <= API_RATE_PER_S_MAX);
const _: () = assert!(API_RATE_BURST_S >= 1);
const _: () = assert!(CONSOLE_LOGIN_BURST >= 1 && CONSOLE_LOGINS_PER_MIN >= 1);
const _: () = assert!(API_BODY_MAX_BYTES < EVENT_PAYLOAD_MAX_BYTES);

const _: () = assert!(RECONCILE_BACKOFF_BASE_MS <= RECONCILE_BACKOFF_MAX_MS);
const _: () = assert!(ABANDON_AFTER_DEFAULT_MS <= ABANDON_AFTER_MAX_MS);
// A default run can start an effect towards a provider with the default request timeout (5 s)
// and still reconcile it after the first backoff.
const _: () = assert!(5_000 + RECONCILE_BACKOFF_BASE_MS < RUN_DEADLINE_DEFAULT_MS);
const _: () = assert!(WRITER_BATCH_MAX <= WRITER_CHANNEL_CAPACITY);
// A batch's own entities stay cached across it: twice the largest batch at the least.
const _: () = assert!(ENTITY_CACHE_MAX >= 2 * WRITER_BATCH_MAX);
const _: () = assert!(INTENT_ID_MIN_CHARS < INTENT_ID_MAX_CHARS);
const _: () = assert!(ATTEMPTS_PER_INTENT_DEFAULT >= 1);
const _: () = assert!(NETWORK_RETRIES_PER_RUN_MAX <= NETWORK_RETRIES_PER_RUN_LIMIT);
const _: () = assert!(RECONCILIATIONS_PER_RUN_DEFAULT >= RECONCILIATIONS_PER_INTENT_DEFAULT);
const _: () = assert!(RECONCILIATIONS_PER_RUN_DEFAULT <= RECONCILIATIONS_PER_RUN_LIMIT);
const _: () = assert!(NETWORK_RETRY_BACKOFF_BASE_MS <= NETWORK_RETRY_BACKOFF_MAX_MS);
const _: () = assert!(RUN_DEADLINE_DEFAULT_MS <= RUN_DEADLINE_MAX_MS);
const _: () = assert!(APPROVAL_TTL_DEFAULT_MS <= APPROVAL_TTL_MAX_MS);
const _: () = assert!(AMOUNT_MINOR_MAX > 0);
const _: () = assert!(RUN_COST_DEFAULT_MINOR <= AMOUNT_MINOR_MAX);
const _: () = assert!(EFFECT_AMOUNT_DEFAULT_MAX_MINOR <= RUN_COST_DEFAULT_MINOR);
// A full batch of maximal facts fits one event.
const _: () =
    assert!(FACTS_MAX * 4 * (FACTS_VALUE_MAX_CHARS + FACTS_EVIDENCE_MAX_CHARS + 64) < EVENT_PAYLOAD_MAX_BYTES);
const _: () = assert!(FACTS_EVIDENCE_MAX_CHARS < FACTS_MESSAGE_MAX_CHARS);
// Nine million maximal amounts sum inside i64 (the checked sums are still there on top).
const _: () = assert!(AMOUNT_MINOR_MAX.checked_mul(9_000_000).is_some());

/// The wait before network retry number `n` (1-based).
pub fn network_retry_backoff_ms(n: u32) -> u64 {
    let shift = n.saturating_sub(1).min(16);
    (NETWORK_RETRY_BACKOFF_BASE_MS << shift).min(NETWORK_RETRY_BACKOFF_MAX_MS)
}
const _: () = assert!(LEASE_TTL_MIN_MS <= LEASE_TTL_DEFAULT_MS);
const _: () = assert!(LEASE_TTL_DEFAULT_MS <= LEASE_TTL_MAX_MS);
const _: () = assert!(WORKER_CONCURRENCY_DEFAULT >= 1);
const _: () = assert!(WORKER_CONCURRENCY_DEFAULT <= WORKER_CONCURRENCY_MAX);
const _: () = assert!(WORKER_POLL_MIN_MS <= WORKER_POLL_DEFAULT_MS);
const _: () = assert!(WORKER_POLL_DEFAULT_MS <= WORKER_POLL_MAX_MS);
// A worker polls well within a lease: a takeover waits at most one poll after the expiry.
const _: () = assert!(WORKER_POLL_DEFAULT_MS < LEASE_TTL_DEFAULT_MS);
const _: () = assert!(WORKER_HEALTH_MIN_MS <= WORKER_HEALTH_DEFAULT_MS);
const _: () = assert!(SHUTDOWN_GRACE_MS <= WORKER_GRACE_MAX_MS);

/// The backoff before reconciliation number `n` (1-based).
pub fn reconcile_backoff_ms(n: u32) -> u64 {
    let shift = n.saturating_sub(1).min(16);
    (RECONCILE_BACKOFF_BASE_MS << shift).min(RECONCILE_BACKOFF_MAX_MS)
}

/// The time an effect needs left before its run's deadline to be started ("a sensitive
/// effect is not started when the time left cannot cover its reconciliation"): its request
/// may take the provider's whole `request_timeout_ms`, and if the answer is lost, reconciliation
/// number `reconciliation` comes one backoff later. Derived from the provider, never a fixed
/// figure: a 5 s timeout needs 6 s. Enforced by `Ledger::decide` on `Reserve` (the attempt is not
/// written ahead) and `StartAttempt` (a reserved intent is released, rejected, its money and
/// order freed).
pub fn reconciliation_reserve_ms(request_timeout_ms: u64, reconciliation: u32) -> u64 {
    request_timeout_ms.saturating_add(reconcile_backoff_ms(reconciliation))
}

// ---------------------------------------------------------------------------------------------
// Agent harness (the `agent` crate, which keeps its bounds here with every other). Defaults are
// seed 003's acceptance table; a run records the limits it starts with in `AgentRunStarted`, so a
// restart never refills them.
// ---------------------------------------------------------------------------------------------

/// Default model calls per agent run (seed 003: six transport calls). Enforced by the loop
/// before each call reservation (`model_budget`).
pub const AGENT_MODEL_CALLS_DEFAULT: u32 = 6;

/// Default tool attempts per agent run, failed attempts included (seed 003: four). Enforced
/// by the guard, step 6 (`tool_budget`).
pub const AGENT_TOOL_CALLS_DEFAULT: u32 = 4;

/// Default admitted attempts per canonical signature (tool name + canonical arguments;
/// seed 003: one). Enforced by the guard, step 7 (`repeated_call`).
pub const AGENT_REPEATS_PER_SIGNATURE_DEFAULT: u32 = 1;

/// Default agent run deadline, from run start (seed 003: 120 s). The absolute instant is
/// fixed in `AgentRunStarted`; the loop races every model call and tool body against it.
pub const AGENT_DEADLINE_DEFAULT_MS: u64 = 120_000;

/// Default schema corrections per run: unknown tools, malformed and schema-invalid arguments
/// the model may correct. Three gives a model room to fix a typo twice without letting it
/// loop. Enforced by the guard, steps 2 and 4 (`schema_budget`).
pub const AGENT_SCHEMA_CORRECTIONS_DEFAULT: u32 = 3;

/// Default consecutive turns whose tool calls produced no progress (no new evidence, no
/// state change). Larger than [`AGENT_TOOL_CALLS_DEFAULT`] so seed 003's `changing`
/// scenario stops on the tool budget, as the seed says. Enforced by the loop before each
/// model call (`no_progress`).
pub const AGENT_NO_PROGRESS_ITERATIONS_DEFAULT: u32 = 5;

/// Default input tokens over one agent run, from the vendors' `usage`: a million, far above
/// seed 003's six calls of a few thousand tokens, so a default run is bounded without a task
/// ever meeting it. A run whose usage is unknown cannot be counted against it and stops
/// `token_budget`, as under any token limit. Enforced by the loop (`token_budget`).
pub const AGENT_INPUT_TOKENS_DEFAULT: u64 = 1_000_000;

/// Default output tokens over one agent run: room for a hundred calls at the default per-call
/// cap. Enforced by the loop, which also clamps each call's cap to what is left.
pub const AGENT_OUTPUT_TOKENS_DEFAULT: u64 = 80_000;

/// Default model cost of an agent run that was given prices, in minor units: ten thousand in
/// major units, far above any task at today's prices, so a priced run is bounded in money
/// without a flag. A run without prices cannot measure cost; its token defaults bound it.
/// Applied by `AgentLimits::overridden_by`; enforced by the loop (`cost_budget`).
pub const AGENT_COST_DEFAULT_MINOR: i64 = 1_000_000;

/// Default output-token cap sent with each model call (seed 003: `MaxOutputTokens = 800`).
/// A per-call option, not a budget: the budgets are the token and cost totals.
pub const AGENT_OUTPUT_TOKENS_PER_CALL_DEFAULT: u32 = 800;

/// Sub-agents one agent run may start (seed 004: "nombre maximal de délégations à d'autres
/// agents"). Each carves its budgets out of its parent's, so the count bounds how finely a
/// run can split them, not what it may spend. Past it the guard stops the run
/// `delegation_budget`. Enforced by the guard (`agent::guard::decide`) and checked by the fold.
pub const AGENT_DELEGATIONS_DEFAULT: u32 = 2;
/// The most sub-agents a run may be allowed (`--limits '{"delegations_max": N}'`): every one
/// is folded in its parent's state and journal, so their number bounds a run's memory.
/// Enforced by `AgentLimits::validate`.
pub const AGENT_DELEGATIONS_MAX: u32 = 16;

/// Longest ticket text `keel agent run support --ticket FILE` accepts: a customer's message,
/// not a document. Below `AGENT_TOOL_RESULT_MAX_BYTES`, so `read_ticket` returns it whole, and
/// far below an event's payload bound, since the run's input stores the ticket. Enforced by
/// `workflows::support_agent::Case::parse`.
pub const SUPPORT_TICKET_TEXT_MAX_BYTES: usize = 8 * 1024;

/// Default time an agent's effect call may wait for a human approval (24 h): an operator
/// acts within a working day. The wait is outside the run's working time — its deadline moves
/// by the time waited — so an approval given an hour later does not find the run out of time;
/// past it the run stops `deadline_exceeded` and its intent is released. Enforced by the guard
/// (step 9) and by the ledger, which refuses an approval once the window closed.
pub const AGENT_APPROVAL_WAIT_DEFAULT_MS: u64 = 86_400_000;

/// Longest tool-call argument text the guard parses. Larger arguments are refused as a
/// schema correction before parsing, so a runaway model cannot make the guard allocate.
pub const AGENT_TOOL_ARGUMENTS_MAX_BYTES: usize = 16 * 1024;

/// Longest tool result kept in the journal and sent back to the model; longer results are
/// cut and say so. Keeps one event well under [`EVENT_PAYLOAD_MAX_BYTES`].
pub const AGENT_TOOL_RESULT_MAX_BYTES: usize = 16 * 1024;

/// Longest tool name recorded for an unknown tool, so a model cannot write prose into the
/// control events. Enforced by the guard, step 2.
pub const AGENT_TOOL_NAME_MAX_CHARS: usize = 64;

/// Schema violations listed in one error result. The first few are enough for a model to
/// correct its arguments; the rest would only fill its context.
pub const AGENT_SCHEMA_ERRORS_SHOWN_MAX: usize = 3;

/// Default whole-request timeout of the HTTP model transports. Shorter than the default
/// deadline so one stuck call cannot eat a run; the deadline still races every call.
pub const MODEL_HTTP_TIMEOUT_DEFAULT_MS: u64 = 60_000;

/// Default connect timeout of the HTTP model transports.
pub const MODEL_HTTP_CONNECT_TIMEOUT_DEFAULT_MS: u64 = 5_000;

/// Most model calls a run may be given (`--limits model_calls_max`). A task that needs more
/// is a loop, not a task; the bound also keeps one run's journal, which a resume folds, to a
/// few thousand events. Enforced by `AgentLimits::validate` (the CLI answers 64).
pub const AGENT_MODEL_CALLS_MAX: u32 = 1_000;

/// Most tool attempts a run may be given, in total, per tool or per signature. Same reason as
/// [`AGENT_MODEL_CALLS_MAX`]. Enforced by `AgentLimits::validate`.
pub const AGENT_TOOL_CALLS_MAX: u32 = 1_000;

/// Largest input or output token limit a run may be given: a billion tokens is beyond any
/// task's need, and keeps every token sum and its price far from `u64`/`i64` overflow.
/// Enforced by `AgentLimits::validate`.
pub const AGENT_TOKENS_MAX: u64 = 1_000_000_000;

/// Largest cost limit, minor units (ten million in major units). Enforced by
/// `AgentLimits::validate`.
pub const AGENT_COST_MINOR_MAX: i64 = 1_000_000_000;

/// Highest price per million tokens, minor units: a hundred thousand in major units, a
/// thousand times the dearest model sold today. Bounds every call's cost product. Enforced by
/// `AgentLimits::validate`.
pub const AGENT_PRICE_PER_MTOK_MAX: i64 = 10_000_000;

/// Longest agent run deadline: seven days, long enough for a run that waits on a human's
/// approval over a weekend, and an instant chrono always represents (a `u64::MAX` deadline
/// used to overflow `DateTime + TimeDelta`). Enforced by `AgentLimits::validate`.
pub const AGENT_DEADLINE_MAX_MS: u64 = 7 * 24 * 60 * 60 * 1_000;

/// Most schema corrections a run may be given: past a hundred a model is not correcting, it
/// is failing. Enforced by `AgentLimits::validate`.
pub const AGENT_SCHEMA_CORRECTIONS_MAX: u32 = 100;

/// Highest output-token cap per call. At a few bytes a token a full answer stays well under
/// [`AGENT_ANSWER_MAX_BYTES`]; a larger answer is still refused by that bound. Enforced by
/// `AgentLimits::validate` (and at least 1: a call that may write nothing means nothing).
pub const AGENT_OUTPUT_TOKENS_PER_CALL_MAX: u32 = 8_192;

/// Most entries in a per-name limit map (`tool_calls_per_tool_max`, `prices`), and the
/// longest name in one: the maps are written into `AgentRunStarted`, which must fit one event.
/// Enforced by `AgentLimits::validate`.
pub const AGENT_LIMIT_ENTRIES_MAX: usize = 64;
/// See [`AGENT_LIMIT_ENTRIES_MAX`].
pub const AGENT_LIMIT_NAME_MAX_CHARS: usize = 128;

/// Largest normalised model answer the loop records (its `ModelAnswerRecorded`, serialized).
/// An answer must fit one event ([`EVENT_PAYLOAD_MAX_BYTES`]) with room for the envelope;
/// a larger one (5 MB of text) is not recorded: the call stays counted and the run stops
/// `answer_too_large`, naming this bound. Enforced by the loop after each answer.
pub const AGENT_ANSWER_MAX_BYTES: usize = 48 * 1024;

/// Most tool calls one answer may propose. Vendors send a handful in parallel; a thousand is
/// a runaway, refused whole (`answer_too_large`, naming this bound) before any of them
/// reaches the guard. Enforced by the loop after each answer.
pub const AGENT_TOOL_CALLS_PER_ANSWER_MAX: usize = 64;

/// Largest HTTP body a model client reads. Generous next to [`AGENT_ANSWER_MAX_BYTES`]
/// because the wire form carries blocks Keel drops (e.g. `thinking`); past it the client
/// stops reading, so a 200 MiB answer costs one mebibyte of memory, not a gigabyte. The call
/// stays counted and the run stops `answer_too_large`. Enforced by `adapters::model::http`.
pub const MODEL_RESPONSE_MAX_BYTES: usize = 1 << 20;

// An in-process wait never outlasts one renewal interval of the default lease.
const _: () = assert!(TIMER_IN_PROCESS_MAX_MS < LEASE_TTL_DEFAULT_MS / 3);
const _: () = assert!(SIGNAL_PAYLOAD_MAX_BYTES < EVENT_PAYLOAD_MAX_BYTES / 2);
const _: () = assert!(AGENT_NO_PROGRESS_ITERATIONS_DEFAULT > AGENT_TOOL_CALLS_DEFAULT);
const _: () = assert!(AGENT_MODEL_CALLS_DEFAULT <= AGENT_MODEL_CALLS_MAX);
const _: () = assert!(AGENT_TOOL_CALLS_DEFAULT <= AGENT_TOOL_CALLS_MAX);
const _: () = assert!(AGENT_NO_PROGRESS_ITERATIONS_DEFAULT <= AGENT_MODEL_CALLS_MAX);
const _: () = assert!(AGENT_SCHEMA_CORRECTIONS_DEFAULT <= AGENT_SCHEMA_CORRECTIONS_MAX);
const _: () = assert!(AGENT_DEADLINE_DEFAULT_MS <= AGENT_DEADLINE_MAX_MS);
const _: () = assert!(AGENT_OUTPUT_TOKENS_PER_CALL_DEFAULT <= AGENT_OUTPUT_TOKENS_PER_CALL_MAX);
const _: () = assert!(AGENT_ANSWER_MAX_BYTES < EVENT_PAYLOAD_MAX_BYTES);
const _: () = assert!(AGENT_INPUT_TOKENS_DEFAULT <= AGENT_TOKENS_MAX);
const _: () = assert!(AGENT_COST_DEFAULT_MINOR <= AGENT_COST_MINOR_MAX);
const _: () = assert!(AGENT_OUTPUT_TOKENS_DEFAULT <= AGENT_TOKENS_MAX);
// The default output budget never cuts a default run's calls short.
const _: () = assert!(
    AGENT_OUTPUT_TOKENS_DEFAULT >= AGENT_MODEL_CALLS_DEFAULT as u64 * AGENT_OUTPUT_TOKENS_PER_CALL_DEFAULT as u64
);
const _: () = assert!(AGENT_ANSWER_MAX_BYTES < MODEL_RESPONSE_MAX_BYTES);
const _: () = assert!(AGENT_TOOL_ARGUMENTS_MAX_BYTES < AGENT_ANSWER_MAX_BYTES);
// A whole run's cost at the highest price, with the largest token limits spent on every call,
// stays far from i64 overflow: every cost sum within the limits is exact.
const _: () = assert!(
    (AGENT_TOKENS_MAX as i128) * (AGENT_PRICE_PER_MTOK_MAX as i128) / 1_000_000 * 2 * (AGENT_MODEL_CALLS_MAX as i128)
        < i64::MAX as i128
);
const _: () = assert!(AGENT_REPEATS_PER_SIGNATURE_DEFAULT >= 1);
const _: () = assert!(AGENT_DELEGATIONS_DEFAULT <= AGENT_DELEGATIONS_MAX);
const _: () = assert!(SUPPORT_TICKET_TEXT_MAX_BYTES < AGENT_TOOL_RESULT_MAX_BYTES);
const _: () = assert!(AGENT_TOOL_RESULT_MAX_BYTES < EVENT_PAYLOAD_MAX_BYTES);
const _: () = assert!(AGENT_TOOL_ARGUMENTS_MAX_BYTES < EVENT_PAYLOAD_MAX_BYTES);
const _: () = assert!(MODEL_HTTP_TIMEOUT_DEFAULT_MS < AGENT_DEADLINE_DEFAULT_MS);
const _: () = assert!(MODEL_HTTP_CONNECT_TIMEOUT_DEFAULT_MS < MODEL_HTTP_TIMEOUT_DEFAULT_MS);
const _: () = assert!(REQUEST_FILE_MAX_BYTES > EVENT_PAYLOAD_MAX_BYTES as u64);
const _: () = assert!(TICKET_FILE_MAX_BYTES > SUPPORT_TICKET_TEXT_MAX_BYTES as u64);
const _: () = assert!(TRANSCRIPT_FILE_MAX_BYTES > AGENT_MODEL_CALLS_MAX as u64 * AGENT_ANSWER_MAX_BYTES as u64);

#[cfg(test)]
mod read_tests {
    use super::{read_at_most, read_text_at_most};

    #[test]
    fn a_reader_is_read_whole_up_to_its_bound_and_refused_one_byte_past_it() {
        assert_eq!(read_at_most(&b"four"[..], 4).expect("at the bound"), b"four");
        assert_eq!(read_at_most(&b""[..], 0).expect("empty"), b"");
        let past = read_at_most(&b"five!"[..], 4).expect_err("one byte past the bound");
        assert_eq!(past.kind(), std::io::ErrorKind::FileTooLarge);
        assert!(past.to_string().contains("more than 4 bytes"), "{past}");
        // An endless reader, like /dev/zero: refused after bound + 1 bytes, not read to its end.
        let endless = read_at_most(std::io::repeat(0), 1 << 16).expect_err("endless");
        assert_eq!(endless.kind(), std::io::ErrorKind::FileTooLarge);
        let not_text = read_text_at_most(&[0xff, 0xfe][..], 4).expect_err("not UTF-8");
        assert_eq!(not_text.kind(), std::io::ErrorKind::InvalidData);
    }
}
