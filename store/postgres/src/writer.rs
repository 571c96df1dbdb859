//! The writers: a pool of threads, each owning one connection, each running one command's
//! transaction at a time.
//!
//! [`PgLog`] is the handle (cheap to clone); behind it, [`Options::writers`] threads share
//! one bounded channel. [`EventLog::execute`] hands the command to whichever thread is free
//! and awaits its answer on a oneshot. Commands on different entities commit concurrently;
//! commands on one entity serialise on its lock (`crate::tx`). There is no global lock and
//! no global head row: sequences come from `events_seq`, the chain is per stream.
//!
//! It never decides nor folds anything itself: every decision is `engine::ledger::decide`'s,
//! every fold `engine::ledger::fold::apply`'s, every seal `engine::append::seal`'s.
//!
//! # One command
//!
//! `BEGIN` (READ COMMITTED) → decide over [`Tx`] (locks taken on read) → seal with the
//! per-stream chain → insert the events, fold them into the entities they touch, write the
//! rows and the lease effects → insert a fresh `commits(id)` row when anything was written →
//! compute the reply inside the transaction → `COMMIT` → answer.
//!
//! # Failure
//!
//! A deadlock, a serialization failure, a racing append (`UNIQUE(stream, stream_seq)`), an
//! entity found stale, or a connection lost before `COMMIT` rolls the command back (the
//! server aborts what it did not commit) and runs it again from the start, up to
//! `PG_COMMAND_ATTEMPTS_MAX` times with a short jittered pause. A connection lost *during*
//! `COMMIT` is the database's own unknown outcome: the thread reconnects, waits for the old
//! server process to end, and looks its commit id up — present, the command committed and
//! its reply (computed before `COMMIT`) is answered; absent, it runs the command again. It
//! never assumes either. A refusal writes nothing and is answered at once.
//!
//! # Shutdown
//!
//! Dropping the last handle (or [`PgLog::shutdown`]) closes the channel; each thread
//! finishes the command it holds and exits.

use crate::error::{Error, Result};
use crate::rows;
use crate::schema;
use crate::tx::{Tx, TxEntities};
use chrono::{DateTime, SubsecRound, Utc};
use engine::append::{Chaining, End, Sealed, Tail, seal};
use engine::clock::Clock;
use engine::lease::{ExpiryOnly, OwnerProbe};
use engine::ledger::{Command, Decision, Refusal, Reply, View as _, fold};
use engine::limits::{
    LEASE_TTL_DEFAULT_MS, PG_COMMAND_ATTEMPTS_MAX, PG_COMMIT_RESOLVE_WAIT_MS, PG_RETRY_BACKOFF_MAX_MS,
    PG_WRITERS_DEFAULT, PG_WRITERS_MAX, WRITER_CHANNEL_CAPACITY,
};
use engine::log::{EventLog, LogError};
use engine::provider::BoxFuture;
use postgres::types::Type;
use postgres::{Client, IsolationLevel, NoTls};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How a [`PgLog`] runs.
#[derive(Clone)]
pub struct Options {
    /// Writer threads, one connection each (default `PG_WRITERS_DEFAULT`).
    pub writers: usize,
    /// How long a lease hold lasts.
    pub lease_ttl_ms: u64,
    /// What the host can tell about other lease holders.
    pub owner_probe: Arc<dyn OwnerProbe>,
}

impl Default for Options {
    fn default() -> Self {
        Self { writers: PG_WRITERS_DEFAULT, lease_ttl_ms: LEASE_TTL_DEFAULT_MS, owner_probe: Arc::new(ExpiryOnly) }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options").field("writers", &self.writers).field("lease_ttl_ms", &self.lease_ttl_ms).finish()
    }
}

/// What the writers have done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Commands answered (accepted, refused or failed).
    pub commands: u64,
    /// Transactions committed that wrote something.
    pub commits: u64,
    /// Commands run again after a conflict, a deadlock or a lost connection.
    pub retries: u64,
    /// `COMMIT`s whose answer was lost and resolved by looking the commit id up.
    pub resolved_commits: u64,
}

#[derive(Debug, Default)]
struct Counters {
    commands: AtomicU64,
    commits: AtomicU64,
    retries: AtomicU64,
    resolved_commits: AtomicU64,
}

type Answer = std::result::Result<Reply, LogError>;

struct Job {
    command: Command,
    reply: oneshot::Sender<Answer>,
}

/// A handle on the PostgreSQL event log: cheap to clone. Implements [`EventLog`].
#[derive(Clone)]
pub struct PgLog {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    counters: Arc<Counters>,
}

impl Inner {
    fn close(&self) {
        drop(self.sender.lock().expect("the sender lock is never poisoned: nothing panics holding it").take());
        let threads = std::mem::take(
            &mut *self.threads.lock().expect("the threads lock is never poisoned: nothing panics holding it"),
        );
        for thread in threads {
            if thread.join().is_err() {
                tracing::error!("a postgres writer thread panicked");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.close();
    }
}

fn closed() -> LogError {
    LogError::Unavailable { detail: Error::Closed.to_string(), maybe_committed: false }
}

/// Connects to `url` (a `postgres://` URL), without TLS.
pub(crate) fn connect(url: &str) -> Result<Client> {
    Ok(Client::connect(url, NoTls)?)
}

impl PgLog {
    /// Connects to the database at `url`, migrates it to this build's schema, and starts
    /// `options.writers` writer threads, each with its own connection.
    ///
    /// # Errors
    ///
    /// [`Error::Options`] for a writer count outside `1..=PG_WRITERS_MAX`,
    /// [`Error::SchemaTooNew`], [`Error::ImportUnfinished`] for a log half migrated (a
    /// writer there would number events the import is still copying), PostgreSQL's when it
    /// cannot be reached.
    pub fn open(url: &str, options: Options, clock: Arc<dyn Clock>) -> Result<PgLog> {
        if !(1..=PG_WRITERS_MAX).contains(&options.writers) {
            return Err(Error::Options(format!("writers must be 1 to {PG_WRITERS_MAX}, not {}", options.writers)));
        }
        let first = reconnecting(url, |client| {
            schema::migrate(client)?;
            if let Some(found) = crate::import::unfinished(client)? {
                return Err(Error::ImportUnfinished { found: Box::new(found) });
            }
            backend_pid(client)
        })?;
        let (sender, receiver) = mpsc::channel(WRITER_CHANNEL_CAPACITY);
        let receiver = Arc::new(Mutex::new(receiver));
        let counters = Arc::new(Counters::default());
        let mut threads = Vec::with_capacity(options.writers);
        let mut first = Some(first);
        for index in 0..options.writers {
            let (client, backend) = match first.take() {
                Some(connected) => connected,
                None => reconnecting(url, backend_pid)?,
            };
            let writer = Writer {
                url: url.to_owned(),
                client: Some(client),
                backend,
                clock: Arc::clone(&clock),
                options: options.clone(),
                counters: Arc::clone(&counters),
            };
            let receiver = Arc::clone(&receiver);
            let thread = std::thread::Builder::new()
                .name(format!("keel-pg-writer-{index}"))
                .spawn(move || writer.run(&receiver))?;
            threads.push(thread);
        }
        Ok(PgLog {
            inner: Arc::new(Inner {
                url: url.to_owned(),
                sender: Mutex::new(Some(sender)),
                threads: Mutex::new(threads),
                counters,
            }),
        })
    }

    /// The database's URL.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// What the writers have done so far.
    pub fn stats(&self) -> WriterStats {
        let c = &self.inner.counters;
        WriterStats {
            commands: c.commands.load(Ordering::Relaxed),
            commits: c.commits.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            resolved_commits: c.resolved_commits.load(Ordering::Relaxed),
        }
    }

    /// Closes the channel, lets each writer finish the command it holds, and joins them.
    pub fn shutdown(&self) {
        self.inner.close();
    }

    fn sender(&self) -> Option<mpsc::Sender<Job>> {
        self.inner.sender.lock().expect("the sender lock is never poisoned: nothing panics holding it").clone()
    }
}

impl EventLog for PgLog {
    fn execute(&self, command: Command) -> BoxFuture<'_, std::result::Result<Reply, LogError>> {
        Box::pin(async move {
            let sender = self.sender().ok_or_else(closed)?;
            let (reply, answer) = oneshot::channel();
            sender.send(Job { command, reply }).await.map_err(|_| closed())?;
            drop(sender);
            answer.await.map_err(|_| LogError::Unavailable {
                detail: "the writer stopped before answering (it panicked)".to_owned(),
                maybe_committed: true,
            })?
        })
    }
}

/// What one attempt at a command came to.
enum Attempt {
    /// Committed (or nothing to commit): the answer.
    Done(Answer),
    /// Rolled back: run it again.
    Again(Error),
    /// `COMMIT` was sent and its answer lost: the id to look up, the reply if it is there.
    Unknown { id: uuid::Uuid, reply: Reply, error: Error },
    /// Failed for good.
    Failed(Error),
}

/// One writer thread's state.
struct Writer {
    url: String,
    client: Option<Client>,
    /// The server process of `client`, to wait for after a lost `COMMIT`.
    backend: i32,
    clock: Arc<dyn Clock>,
    options: Options,
    counters: Arc<Counters>,
}

fn backend_pid(client: &mut Client) -> Result<i32> {
    Ok(client.query_one("SELECT pg_backend_pid()", &[])?.get(0))
}

/// Connects to `url` and runs `step` on the connection, again on a new connection when the
/// connection is lost (at most `PG_COMMAND_ATTEMPTS_MAX` times, paused as a retried command
/// is): a dropped connection while a log is being opened is not the end of the process. Every
/// `step` is safe to run again — the migration is one transaction that re-reads the version
/// it starts from, so a lost `COMMIT` answer makes the next run find it done.
fn reconnecting<T>(url: &str, mut step: impl FnMut(&mut Client) -> Result<T>) -> Result<(Client, T)> {
    let mut attempt = 1;
    loop {
        let result = connect(url).and_then(|mut client| step(&mut client).map(|value| (client, value)));
        match result {
            Err(error) if error.is_connection() && attempt < PG_COMMAND_ATTEMPTS_MAX => {
                tracing::debug!(%error, attempt, "postgres connection lost while opening the log: connecting again");
                attempt += 1;
                pause(attempt);
            }
            done => return done,
        }
    }
}

impl Writer {
    fn run(mut self, receiver: &Mutex<mpsc::Receiver<Job>>) {
        loop {
            let job = {
                let mut receiver =
                    receiver.lock().expect("the receiver lock is never poisoned: nothing panics holding it");
                receiver.blocking_recv()
            };
            let Some(job) = job else { break };
            let answer = self.execute(&job.command);
            self.counters.commands.fetch_add(1, Ordering::Relaxed);
            // A caller that stopped waiting needs no answer.
            let _ = job.reply.send(answer);
        }
        tracing::debug!("postgres writer drained and stopped");
    }

    fn client(&mut self) -> Result<&mut Client> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let mut client = connect(&self.url)?;
            self.backend = backend_pid(&mut client)?;
            self.client = Some(client);
        }
        Ok(self.client.as_mut().expect("connected just above"))
    }

    fn execute(&mut self, command: &Command) -> Answer {
        let mut last = None;
        for attempt in 1..=PG_COMMAND_ATTEMPTS_MAX {
            if attempt > 1 {
                self.counters.retries.fetch_add(1, Ordering::Relaxed);
                pause(attempt);
            }
            match self.attempt(command) {
                Attempt::Done(answer) => return answer,
                Attempt::Again(error) => {
                    tracing::debug!(%error, attempt, "postgres command runs again");
                    last = Some(error);
                }
                Attempt::Failed(error) => {
                    return Err(LogError::Unavailable { detail: error.to_string(), maybe_committed: false });
                }
                Attempt::Unknown { id, reply, error } => {
                    tracing::warn!(%error, %id, "the answer to COMMIT was lost: looking the commit up");
                    match self.resolve(id) {
                        Ok(true) => {
                            self.counters.resolved_commits.fetch_add(1, Ordering::Relaxed);
                            self.counters.commits.fetch_add(1, Ordering::Relaxed);
                            return Ok(reply);
                        }
                        Ok(false) => last = Some(error),
                        Err(lookup) => {
                            return Err(LogError::Unavailable {
                                detail: format!(
                                    "COMMIT's answer was lost ({error}) and looking it up failed: {lookup}"
                                ),
                                maybe_committed: true,
                            });
                        }
                    }
                }
            }
        }
        let detail = last.map_or_else(String::new, |error| error.to_string());
        Err(LogError::Unavailable {
            detail: format!("gave up after {PG_COMMAND_ATTEMPTS_MAX} attempts: {detail}"),
            maybe_committed: false,
        })
    }

    /// Whether the transaction `id` committed, once the server process that ran it is gone.
    fn resolve(&mut self, id: uuid::Uuid) -> Result<bool> {
        let old = self.backend;
        self.client = None;
        let client = self.client()?;
        let step = Duration::from_millis(10);
        let mut waited = Duration::ZERO;
        let limit = Duration::from_millis(PG_COMMIT_RESOLVE_WAIT_MS);
        loop {
            let alive: bool =
                client.query_one("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", &[&old])?.get(0);
            if !alive {
                break;
            }
            if waited >= 2 * limit {
                return Err(Error::CommitUnresolved(format!(
                    "server process {old} did not end after being terminated"
                )));
            }
            if waited >= limit {
                // Ends it: a commit it had not made is aborted, one it made stays.
                client.execute("SELECT pg_terminate_backend($1)", &[&old])?;
            }
            std::thread::sleep(step);
            waited += step;
        }
        Ok(client.query_one("SELECT EXISTS (SELECT 1 FROM commits WHERE id = $1)", &[&id])?.get(0))
    }

    fn attempt(&mut self, command: &Command) -> Attempt {
        let now = self.clock.now().trunc_subsecs(6);
        let options = self.options.clone();
        let client = match self.client() {
            Ok(client) => client,
            Err(error) => return Attempt::Again(error),
        };
        // READ COMMITTED (PostgreSQL's default, said here): each read after a lock sees every
        // commit made before the lock was granted.
        let mut tx = match client.build_transaction().isolation_level(IsolationLevel::ReadCommitted).start() {
            Ok(tx) => tx,
            Err(error) => return Attempt::Again(error.into()),
        };
        let id = uuid::Uuid::new_v4();
        let decided = decide_and_write(&mut tx, &options, command, now, id);
        let (reply, wrote) = match decided {
            Ok(Ok(done)) => done,
            Ok(Err(refusal)) => {
                // Nothing written: ending the transaction either way is the same.
                let _ = tx.rollback();
                return Attempt::Done(Err(LogError::Refused(refusal)));
            }
            Err(error) => {
                let _ = tx.rollback();
                return if error.is_retryable() || error.is_connection() {
                    Attempt::Again(error)
                } else {
                    Attempt::Failed(error)
                };
            }
        };
        match tx.commit() {
            Ok(()) => {
                if wrote {
                    self.counters.commits.fetch_add(1, Ordering::Relaxed);
                }
                Attempt::Done(Ok(reply))
            }
            Err(error) => {
                let error = Error::from(error);
                if error.is_connection() && wrote {
                    Attempt::Unknown { id, reply, error }
                } else if error.is_retryable() || error.is_connection() {
                    // The server answered that it did not commit (or there was nothing to commit).
                    Attempt::Again(error)
                } else {
                    Attempt::Failed(error)
                }
            }
        }
    }
}

/// A jittered pause before attempt `attempt` (from 2): up to `min(2^attempt, max)` ms.
fn pause(attempt: u32) {
    let ceiling = (1_u64 << attempt.min(16)).min(PG_RETRY_BACKOFF_MAX_MS);
    let jitter = u64::from(uuid::Uuid::new_v4().as_bytes()[0]) * ceiling / 255;
    std::thread::sleep(Duration::from_millis(jitter));
}

/// Decides `command` inside `tx` and writes what it decided; `Ok(Err(refusal))` wrote
/// nothing. On success, the reply (read inside the transaction, after the writes) and whether
/// anything was written (then a `commits` row with `id` was too).
fn decide_and_write(
    tx: &mut postgres::Transaction<'_>,
    options: &Options,
    command: &Command,
    now: DateTime<Utc>,
    id: uuid::Uuid,
) -> Result<std::result::Result<(Reply, bool), Refusal>> {
    let view = Tx::new(tx, &*options.owner_probe, options.lease_ttl_ms);
    let decided = engine::ledger::decide(&view, &view, command, now);
    view.finish()?;
    let Decision { events, target, leases } = match decided {
        Ok(decision) => decision,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let sealed = seal_events(&view, events, command, now)?;
    let sealed = match sealed {
        Ok(sealed) => sealed,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let wrote = !sealed.is_empty() || !leases.is_empty();
    view.apply_leases(&leases)?;
    if !sealed.is_empty() {
        view.with(|tx| rows::insert_events(tx, &sealed))?;
    }
    for one in &sealed {
        view.set_length(&one.stored.stream, one.stored.stream_seq);
    }
    let mut entities = TxEntities::new(&view);
    for one in &sealed {
        if let Err(error) = fold::apply(&mut entities, &one.stored) {
            // A failed or stale read makes the fold fail too: that is a retry, not a bug.
            entities.failed()?;
            panic!("{error}");
        }
    }
    entities.write_back()?;
    if wrote {
        view.with(|tx| {
            Ok(tx.execute_typed(
                "INSERT INTO commits (id, at) VALUES ($1, $2)",
                &[(&id, Type::UUID), (&now, Type::TIMESTAMPTZ)],
            )?)
        })?;
    }
    let reply = engine::ledger::reply_after(&view, &target);
    view.finish()?;
    Ok(Ok((reply, wrote)))
}

/// Seals a decision's events with the per-stream chain; a read failure fails the command.
/// The sequences for all the events are taken in one call, and the ends of all their streams
/// read in one statement, before sealing.
fn seal_events(
    view: &Tx<'_, '_>,
    events: Vec<engine::event::Event>,
    command: &Command,
    now: DateTime<Utc>,
) -> Result<std::result::Result<Vec<Sealed>, Refusal>> {
    if events.is_empty() {
        return Ok(Ok(Vec::new()));
    }
    let mut streams: Vec<engine::event::StreamId> = events.iter().map(engine::event::Event::stream).collect();
    streams.sort();
    streams.dedup();
    view.prefetch_ends(&streams.iter().collect::<Vec<_>>())?;
    let mut seqs = view.with(|tx| rows::next_seqs(tx, events.len()))?.into_iter();
    let failure = std::cell::RefCell::new(None::<Error>);
    let note = |error: Error| {
        failure.borrow_mut().get_or_insert(error);
    };
    let mut next_seq = || seqs.next().expect("seal numbers each event once: one sequence was taken for each");
    let mut stream_hash = |stream: &engine::event::StreamId, stream_seq: u64| match view.event_at(stream, stream_seq) {
        Ok(Some((hash, _))) => hash,
        Ok(None) => {
            note(Error::corrupt(0, format!("stream {stream} has no event {stream_seq}")));
            String::new()
        }
        Err(error) => {
            note(error);
            String::new()
        }
    };
    let mut stream_length = |stream: &engine::event::StreamId| {
        view.stream_length(stream).unwrap_or_else(|e| {
            note(e);
            0
        })
    };
    let mut seq_of = |tail: Tail<'_>, end: End| {
        let stream = match tail {
            Tail::Intent(key) => key.stream(),
            Tail::Run(run_id) => run_id.stream(),
        };
        match (tail, end) {
            (Tail::Intent(key), End::Latest) => view.intent(key).map(|i| i.last_seq),
            (Tail::Run(run_id), End::Latest) => view.run(run_id).map(|r| r.last_seq),
            (_, End::First) => match view.event_at(&stream, 1) {
                Ok(found) => found.map(|(_, seq)| seq),
                Err(error) => {
                    note(error);
                    None
                }
            },
        }
    };
    let sealed = seal(
        events,
        &command.cause,
        now,
        Chaining::PerStream { next_seq: &mut next_seq, stream_hash: &mut stream_hash },
        &mut stream_length,
        &mut seq_of,
    );
    if let Some(error) = failure.into_inner() {
        return Err(error);
    }
    view.finish()?;
    Ok(sealed)
}
