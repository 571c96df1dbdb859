//! The writers: a pool of threads, each owning one connection, each running one batch of
//! commands in one transaction at a time (group commit).
//!
//! [`PgLog`] is the handle (cheap to clone); behind it, [`Options::writers`] threads share
//! one bounded channel. [`EventLog::execute`] hands the command to whichever thread is free
//! and awaits its answer on a oneshot. A free thread takes the commands queued, up to
//! `PG_BATCH_COMMANDS_MAX`, without waiting for more. Commands on different entities commit
//! concurrently; commands on one entity serialise on its lock (`crate::tx`). There is no
//! global lock and no global head row: sequences come from `events_seq`, the chain is per
//! stream.
//!
//! It never decides nor folds anything itself: every decision is `engine::ledger::decide`'s,
//! every fold `engine::ledger::fold::apply`'s, every seal `engine::append::seal`'s.
//!
//! # One batch
//!
//! `BEGIN` (READ COMMITTED) → for each command, in the order taken: a savepoint → decide over
//! [`Tx`] (locks taken on read; the batch's earlier commands' writes are seen, their locks
//! already held) → seal with the per-stream chain → insert the events, fold them into the
//! entities they touch, write the rows and the lease effects → compute the reply. Then one
//! fresh `commits(id)` row when anything was written → `COMMIT` → every answer.
//!
//! # Failure
//!
//! A refusal or an error rolls its command back to its savepoint: the batch's other
//! commands go on, and their answers wait for its `COMMIT` like the refusal's. A deadlock, a
//! serialization failure, a racing append (`UNIQUE(stream, stream_seq)`) or an entity found
//! stale makes that command run again in the thread's next transaction, after this one ends
//! (so a deadlock's other party is no longer waited for), up to `PG_COMMAND_ATTEMPTS_MAX`
//! times with a short jittered pause. A connection lost before `COMMIT` rolls the whole batch
//! back (the server aborts what it did not commit) and runs it again. A connection lost
//! *during* `COMMIT` is the database's own unknown outcome: the thread reconnects, waits for
//! the old server process to end, and looks the batch's one commit id up — present, the whole
//! batch committed and the replies (computed before `COMMIT`) are answered; absent, the whole
//! batch runs again, refusals included (they decided over writes that did not commit). It
//! never assumes either.
//!
//! # Shutdown
//!
//! Dropping the last handle (or [`PgLog::shutdown`]) closes the channel; each thread
//! finishes the batch it holds and exits.

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
    LEASE_TTL_DEFAULT_MS, PG_BATCH_COMMANDS_MAX, PG_COMMAND_ATTEMPTS_MAX, PG_COMMIT_RESOLVE_WAIT_MS,
    PG_RETRY_BACKOFF_MAX_MS, PG_WRITERS_DEFAULT, PG_WRITERS_MAX, WRITER_CHANNEL_CAPACITY,
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
    /// Commands run again after a conflict, a deadlock or a lost connection (each command of a
    /// batch run again counts).
    pub retries: u64,
    /// `COMMIT`s (of whole batches) whose answer was lost and resolved by looking the commit
    /// id up.
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

/// What one command came to inside a batch's transaction.
enum Step {
    /// Its answer, given once the batch commits.
    Answered(Answer),
    /// Rolled back: run it again in the next transaction. Why, for the error it ends with
    /// when it never gets through.
    Again(String),
}

/// What one attempt at a batch came to.
enum Attempt {
    /// Committed (or nothing to commit): each command's step, in order.
    Done(Vec<Step>),
    /// Rolled back as a whole: run every command again.
    Again(Error),
    /// `COMMIT` was sent and its answer lost: the id to look up, the steps if it is there.
    Unknown { id: uuid::Uuid, steps: Vec<Step>, error: Error },
    /// Failed for good, every command with it.
    Failed(Error),
}

impl Attempt {
    /// A failure of the batch as a whole: run it again when the connection is gone or the
    /// server's error is one a new attempt may get past.
    fn from_error(error: Error) -> Self {
        if error.is_retryable() || error.is_connection() { Self::Again(error) } else { Self::Failed(error) }
    }
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
/// is): a dropped connection while a log is being opened or asked whether it exists, or while
/// a lost `COMMIT` is looked up, is not the end of the process. Every `step` is safe to run
/// again — the migration is one transaction that re-reads the version it starts from, so a
/// lost `COMMIT` answer makes the next run find it done; the existence check and the lookup
/// only read (the lookup ends a server process already ending).
pub(crate) fn reconnecting<T>(url: &str, mut step: impl FnMut(&mut Client) -> Result<T>) -> Result<(Client, T)> {
    let mut attempt = 1;
    loop {
        let result = connect(url).and_then(|mut client| step(&mut client).map(|value| (client, value)));
        match result {
            Err(error) if error.is_connection() && attempt < PG_COMMAND_ATTEMPTS_MAX => {
                tracing::debug!(%error, attempt, "postgres connection lost: connecting again");
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
            let jobs = {
                let mut receiver =
                    receiver.lock().expect("the receiver lock is never poisoned: nothing panics holding it");
                let Some(first) = receiver.blocking_recv() else { break };
                let mut jobs = Vec::with_capacity(PG_BATCH_COMMANDS_MAX);
                jobs.push(first);
                // What is queued already, not what may come: a batch never waits to fill.
                while jobs.len() < PG_BATCH_COMMANDS_MAX {
                    let Ok(job) = receiver.try_recv() else { break };
                    jobs.push(job);
                }
                jobs
            };
            self.execute(jobs);
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

    /// Runs `jobs` as batches until each is answered: the first attempt all of them, each
    /// later one those sent back by a conflict (or all, after the batch rolled back). A
    /// command is answered as soon as the transaction that decided it ends.
    fn execute(&mut self, jobs: Vec<Job>) {
        // Each job not answered yet, with why it last ran again.
        let mut pending: Vec<(Job, Option<String>)> = jobs.into_iter().map(|job| (job, None)).collect();
        for attempt in 1..=PG_COMMAND_ATTEMPTS_MAX {
            if pending.is_empty() {
                return;
            }
            if attempt > 1 {
                self.counters.retries.fetch_add(pending.len() as u64, Ordering::Relaxed);
                pause(attempt);
            }
            let commands: Vec<&Command> = pending.iter().map(|(job, _)| &job.command).collect();
            let tried = self.attempt(&commands);
            let steps = self.steps(tried, commands.len(), attempt);
            let mut again = Vec::new();
            for ((job, _), step) in pending.into_iter().zip(steps) {
                match step {
                    Step::Answered(answer) => self.answer(job, answer),
                    Step::Again(why) => {
                        tracing::debug!(%why, attempt, "postgres command runs again");
                        again.push((job, Some(why)));
                    }
                }
            }
            pending = again;
        }
        for (job, last) in pending {
            let detail = format!("gave up after {PG_COMMAND_ATTEMPTS_MAX} attempts: {}", last.unwrap_or_default());
            self.answer(job, Err(LogError::Unavailable { detail, maybe_committed: false }));
        }
    }

    fn answer(&self, job: Job, answer: Answer) {
        self.counters.commands.fetch_add(1, Ordering::Relaxed);
        // A caller that stopped waiting needs no answer.
        let _ = job.reply.send(answer);
    }

    /// What an attempt at a batch of `n` commands came to for each of them, a lost `COMMIT`
    /// looked up first.
    fn steps(&mut self, attempt: Attempt, n: usize, number: u32) -> Vec<Step> {
        let every = |step: &dyn Fn() -> Step| -> Vec<Step> { (0..n).map(|_| step()).collect() };
        match attempt {
            Attempt::Done(steps) => steps,
            Attempt::Again(error) => {
                tracing::debug!(%error, attempt = number, commands = n, "postgres batch runs again");
                every(&|| Step::Again(error.to_string()))
            }
            Attempt::Failed(error) => every(&|| {
                Step::Answered(Err(LogError::Unavailable { detail: error.to_string(), maybe_committed: false }))
            }),
            Attempt::Unknown { id, steps, error } => {
                tracing::warn!(%error, %id, "the answer to COMMIT was lost: looking the commit up");
                match self.resolve(id) {
                    Ok(true) => {
                        self.counters.resolved_commits.fetch_add(1, Ordering::Relaxed);
                        self.counters.commits.fetch_add(1, Ordering::Relaxed);
                        steps
                    }
                    Ok(false) => every(&|| Step::Again(error.to_string())),
                    Err(lookup) => {
                        let detail = format!("COMMIT's answer was lost ({error}) and looking it up failed: {lookup}");
                        every(&|| {
                            Step::Answered(Err(LogError::Unavailable { detail: detail.clone(), maybe_committed: true }))
                        })
                    }
                }
            }
        }
    }

    /// Whether the transaction `id` committed, once the server process that ran it is gone.
    /// The lookup runs on a new connection, connected again when that one is lost too (as
    /// [`reconnecting`] does): the answer is still there to be read, so a second lost
    /// connection is no reason to leave the commands unresolved.
    fn resolve(&mut self, id: uuid::Uuid) -> Result<bool> {
        let old = self.backend;
        self.client = None;
        let step = Duration::from_millis(10);
        let mut waited = Duration::ZERO;
        let limit = Duration::from_millis(PG_COMMIT_RESOLVE_WAIT_MS);
        let (client, (backend, committed)) = reconnecting(&self.url, |client| {
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
            let committed = client.query_one("SELECT EXISTS (SELECT 1 FROM commits WHERE id = $1)", &[&id])?.get(0);
            Ok((backend_pid(client)?, committed))
        })?;
        self.backend = backend;
        self.client = Some(client);
        Ok(committed)
    }

    /// Runs `commands` in one transaction, each in its own savepoint, and commits them.
    fn attempt(&mut self, commands: &[&Command]) -> Attempt {
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
        let mut steps = Vec::with_capacity(commands.len());
        let mut wrote = false;
        for (n, command) in commands.iter().enumerate() {
            match run_one(&mut tx, &options, command, now, n == 0) {
                Ok((step, wrote_this)) => {
                    wrote |= wrote_this;
                    steps.push(step);
                }
                Err(error) => {
                    let _ = tx.rollback();
                    return Attempt::from_error(error);
                }
            }
        }
        let id = uuid::Uuid::new_v4();
        if wrote {
            let recorded = tx.execute_typed(
                "INSERT INTO commits (id, at) VALUES ($1, $2)",
                &[(&id, Type::UUID), (&now, Type::TIMESTAMPTZ)],
            );
            if let Err(error) = recorded {
                let _ = tx.rollback();
                return Attempt::from_error(error.into());
            }
        }
        match tx.commit() {
            Ok(()) => {
                if wrote {
                    self.counters.commits.fetch_add(1, Ordering::Relaxed);
                }
                Attempt::Done(steps)
            }
            Err(error) => {
                let error = Error::from(error);
                if error.is_connection() && wrote {
                    Attempt::Unknown { id, steps, error }
                } else {
                    // The server answered that it did not commit (or there was nothing to commit).
                    Attempt::from_error(error)
                }
            }
        }
    }
}

/// Runs one command of a batch inside its own savepoint (the previous command's released in
/// the same round trip): its step, and whether it wrote. `Err` is the batch's: the connection
/// is gone, or the savepoint itself failed.
fn run_one(
    tx: &mut postgres::Transaction<'_>,
    options: &Options,
    command: &Command,
    now: DateTime<Utc>,
    first: bool,
) -> Result<(Step, bool)> {
    // One savepoint name, released before it is set again: savepoints never nest.
    tx.batch_execute(if first { "SAVEPOINT command" } else { "RELEASE SAVEPOINT command; SAVEPOINT command" })?;
    let (step, wrote) = match decide_and_write(tx, options, command, now) {
        Ok(Ok((reply, wrote))) => return Ok((Step::Answered(Ok(reply)), wrote)),
        Ok(Err(refusal)) => (Step::Answered(Err(LogError::Refused(refusal))), false),
        Err(error) if error.is_connection() => return Err(error),
        Err(error) if error.is_retryable() => (Step::Again(error.to_string()), false),
        Err(error) => {
            (Step::Answered(Err(LogError::Unavailable { detail: error.to_string(), maybe_committed: false })), false)
        }
    };
    // A refusal wrote nothing but may hold locks; a failure may have written: either way,
    // only this command is undone.
    tx.batch_execute("ROLLBACK TO SAVEPOINT command")?;
    Ok((step, wrote))
}

/// A jittered pause before attempt `attempt` (from 2): up to `min(2^attempt, max)` ms.
fn pause(attempt: u32) {
    let ceiling = (1_u64 << attempt.min(16)).min(PG_RETRY_BACKOFF_MAX_MS);
    let jitter = u64::from(uuid::Uuid::new_v4().as_bytes()[0]) * ceiling / 255;
    std::thread::sleep(Duration::from_millis(jitter));
}

/// Decides `command` inside `tx` and writes what it decided; `Ok(Err(refusal))` wrote
/// nothing. On success, the reply (read inside the transaction, after the writes) and whether
/// anything was written.
fn decide_and_write(
    tx: &mut postgres::Transaction<'_>,
    options: &Options,
    command: &Command,
    now: DateTime<Utc>,
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
