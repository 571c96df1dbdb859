//! The writer: one thread, one write connection, group commit, state loaded per entity.
//!
//! [`Store`] is the handle; the service behind it is a dedicated thread that owns the only
//! write `rusqlite::Connection`, the chain's head (last sequence and hash) and a bounded
//! cache of hot entities. It never holds the log in memory: a decision reads the entities it
//! is about through indexed reads of the entity rows (`crate::tx`, `crate::rows`).
//!
//! # Cost
//!
//! [`Store::open`] reads the chain's head and checks the events written since the last
//! verified point (`meta.verified_seq`, recorded every `VERIFIED_MARK_EVENTS` events and
//! at shutdown): its cost does not grow with the history. A command costs the indexed reads
//! of the entities it is about and the rows it writes. Memory is the cache
//! (`ENTITY_CACHE_MAX` entities), SQLite's page cache and one batch.
//!
//! # Ordering
//!
//! Every command goes through one bounded channel ([`WRITER_CHANNEL_CAPACITY`]) to the one
//! thread, which decides and appends them in arrival order. Inside a batch, a command is
//! decided against rows that already hold the events of the commands before it (each
//! command's entity rows are written back before the next is decided), so two reservations
//! of one key in one batch see each other exactly as if they had been committed apart.
//! Before deciding anything the writer takes SQLite's write lock (`BEGIN IMMEDIATE`) and
//! checks any event another process appended since its last batch (*catch-up*), dropping
//! the cached entities of the streams they touched: a decision always sees every event
//! committed before it, by anyone.
//!
//! # Group commit
//!
//! The thread blocks for one command, then takes up to `WRITER_BATCH_MAX - 1` more that are
//! already queued, without waiting for more to arrive. The whole batch is one transaction,
//! hence one WAL fsync at `synchronous=FULL`. While it commits, new commands queue up and
//! form the next batch, so the batch size follows the load: one command alone commits at
//! once, 64 concurrent callers share fsyncs. Every batch is stamped with one `now` from the
//! clock, truncated to microseconds so that the stored `at` round-trips exactly.
//!
//! # Acknowledgement
//!
//! Callers are answered only after `COMMIT` returned: an `Ok` reply means the command's
//! events are durable (at [`crate::Durability::Full`]) and visible to every reader. A refused
//! command wrote nothing and is answered with [`LogError::Refused`] after the same commit.
//!
//! # Failure
//!
//! If any statement of a batch fails, the batch is rolled back, the cache is cleared and the
//! head re-read from the database (the batch's rows are gone), and every caller of the batch
//! gets [`LogError::Unavailable`] with `maybe_committed: false`. If `COMMIT` itself fails the
//! answer says `maybe_committed: true`: the caller cannot know. A refusal never stops the
//! writer; an impossible transition in the fold panics it (a bug: the log up to the last
//! commit is intact, and callers waiting on that batch see `maybe_committed: true`).
//!
//! # Shutdown
//!
//! [`Store::shutdown`], or dropping the last handle, closes the channel; the thread finishes
//! every command already queued (or being sent), records the verified point, then exits, and
//! the call joins it. Later calls to `execute` answer `Unavailable` ("the store is closed").

use crate::cache::Cache;
use crate::chain::{self, Chain};
use crate::checkpoint::Checkpointer;
use crate::codec::{self, NewEvent};
use crate::error::{Error, Result};
use crate::leases;
use crate::reader::Reader;
use crate::schema::{self, Options};
use crate::tx::{self, TxEntities, TxView};
use crate::vault::{self, VaultKey};
use chrono::{DateTime, SubsecRound, Utc};
use engine::append::{Chaining, End, Head, Sealed, Tail, seal};
use engine::clock::Clock;
use engine::event::Event;
use engine::event::{IntentKey, StreamId};
use engine::failpoints::Point;
use engine::lease::OwnerProbe;
use engine::ledger::fold;
use engine::ledger::{Action, Command, Decision, Refusal, Reply, ReplyTarget, View as _};
use engine::limits::{
    CHECKPOINT_NUDGE_EVENTS, ENTITY_CACHE_MAX, VERIFIED_MARK_EVENTS, WRITER_BATCH_MAX, WRITER_CHANNEL_CAPACITY,
};
use engine::log::{EventLog, LogError, Unsealed};
use engine::provider::BoxFuture;
use rusqlite::Connection;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use tokio::sync::{mpsc, oneshot};

/// A handle on the event log: cheap to clone, shared by every caller of a process.
///
/// Implements [`EventLog`]. See the [module docs](self) for ordering, group commit,
/// acknowledgement, failure and shutdown.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.inner.path).field("stats", &self.stats()).finish()
    }
}

/// What the writer thread has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WriterStats {
    /// Commands received (accepted, refused or failed).
    pub commands: u64,
    /// Batches processed: one `BEGIN IMMEDIATE` each.
    pub batches: u64,
    /// Commits that appended at least one event: each is one WAL fsync at
    /// `synchronous=FULL`. (A batch of refusals and reads commits nothing to disk.)
    pub commits: u64,
    /// Events appended and committed.
    pub events: u64,
    /// Commands the ledger refused (nothing written for them).
    pub refused: u64,
    /// Batches rolled back or whose commit failed.
    pub failed_batches: u64,
    /// Times a batch found the write lock held by another process past one busy timeout and
    /// asked again.
    pub lock_waits: u64,
}

#[derive(Debug, Default)]
struct Counters {
    commands: AtomicU64,
    batches: AtomicU64,
    commits: AtomicU64,
    events: AtomicU64,
    refused: AtomicU64,
    failed_batches: AtomicU64,
    lock_waits: AtomicU64,
}

type Answer = Result<Reply, LogError>;

struct Job {
    command: Command,
    reply: oneshot::Sender<Answer>,
}

struct Inner {
    path: PathBuf,
    /// The only long-lived sender; `None` once shut down. Callers clone it per command, so
    /// taking it out closes the channel as soon as in-flight sends finish.
    sender: RwLock<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    counters: Arc<Counters>,
    /// What opens the vault's entries, when this store has its key.
    vault: Option<Unsealer>,
}

/// Opens vault entries on a read-only connection of its own (opened at first use), so an
/// unseal never waits behind the writer's batches.
struct Unsealer {
    key: VaultKey,
    conn: Mutex<Option<Connection>>,
}

impl Unsealer {
    fn unseal(&self, path: &Path, intent: &IntentKey) -> Unsealed {
        let mut conn =
            self.conn.lock().expect("the vault connection lock is never poisoned: nothing panics holding it");
        if conn.is_none() {
            match schema::open_reader(path) {
                Ok(opened) => *conn = Some(opened),
                Err(error) => return Unsealed::Unreadable { why: format!("the vault could not be read: {error}") },
            }
        }
        let conn = conn.as_ref().expect("the vault connection was opened just above");
        vault::unseal(conn, &self.key, intent)
    }
}

impl Inner {
    fn close(&self) -> Result<()> {
        drop(self.sender.write().expect("the sender lock is never poisoned: nothing panics while holding it").take());
        let handle =
            self.thread.lock().expect("the thread lock is never poisoned: nothing panics while holding it").take();
        match handle.map(JoinHandle::join) {
            None | Some(Ok(())) => Ok(()),
            Some(Err(panic)) => Err(Error::WriterPanicked { detail: panic_message(panic.as_ref()) }),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Err(error) = self.close() {
            tracing::error!(%error, "store writer stopped abnormally");
        }
    }
}

/// The text of a panic payload (`panic!` with a literal or with a format).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

fn closed() -> LogError {
    LogError::Unavailable { detail: Error::Closed.to_string(), maybe_committed: false }
}

fn writer_gone() -> LogError {
    LogError::Unavailable {
        detail: "the writer stopped before answering (it panicked or was shut down mid-batch)".to_owned(),
        maybe_committed: true,
    }
}

impl Store {
    /// Opens (or creates) the log at `path`, migrates it, reads the chain's head, checks the
    /// events appended since the last verified point, and starts the writer thread.
    ///
    /// Cost: constant in the history — the head and the unverified tail (at most about
    /// `VERIFIED_MARK_EVENTS` events, after a crash; none after a clean shutdown). The one
    /// exception is the first open by this build of a file written before schema version 3:
    /// its migration rebuilds the entity rows from every old event, once.
    ///
    /// # Errors
    ///
    /// [`Error::SchemaTooNew`] for a file from a newer Keel, [`Error::Corrupt`] for a tail
    /// whose chain or payloads do not check, [`Error::Busy`] if another process holds the
    /// write lock past [`Options::write_lock_patience_ms`], [`Error::Sqlite`] / [`Error::Io`] otherwise.
    pub fn open(path: &Path, options: Options, clock: Arc<dyn Clock>) -> Result<Store> {
        let conn = schema::open_writer(path, &options)?;
        if let Some(key) = &options.vault {
            // Its first open writes the vault's check row: as patient as the migration.
            schema::with_write_lock_patience(
                options.write_lock_patience_ms,
                || vault::check_key(&conn, key, clock.now()),
                |detail| {
                    tracing::warn!(%detail, "another process holds the event log's write lock while the vault is checked");
                },
            )?;
        }
        // Data keys a crash left in the vault's keys file without their commit are erased
        // before anything else runs (`vault`, "Ordering and crashes").
        schema::with_write_lock_patience(
            options.write_lock_patience_ms,
            || vault::sweep(&conn),
            |detail| {
                tracing::warn!(%detail, "another process holds the event log's write lock while the vault is swept");
            },
        )?;
        let (chain, recorded) = chain::open_checked(&conn)?;
        tracing::info!(path = %path.display(), last_seq = chain.last_seq, recorded, "store opened");
        let (sender, receiver) = mpsc::channel(WRITER_CHANNEL_CAPACITY);
        let counters = Arc::new(Counters::default());
        let checkpointer = Checkpointer::start(path, options.busy_timeout_ms)?;
        let failpoints = options.failpoints.clone();
        let writer = Writer {
            conn,
            checkpointer,
            unchecked_events: 0,
            chain,
            recorded,
            cache: RefCell::new(Cache::new(ENTITY_CACHE_MAX)),
            actors: HashMap::new(),
            clock,
            counters: Arc::clone(&counters),
            broken: None,
            failpoints,
            lease_ttl_ms: options.lease_ttl_ms,
            write_lock_patience_ms: options.write_lock_patience_ms,
            owner_probe: Arc::clone(&options.owner_probe),
            vault: options.vault.clone(),
            freed_slots: RefCell::new(Vec::new()),
        };
        let thread =
            std::thread::Builder::new().name("keel-store-writer".to_owned()).spawn(move || writer.run(receiver))?;
        Ok(Store {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                sender: RwLock::new(Some(sender)),
                thread: Mutex::new(Some(thread)),
                counters,
                vault: options.vault.map(|key| Unsealer { key, conn: Mutex::new(None) }),
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// A new reader on the same file, with its own read-only connection.
    pub fn reader(&self) -> Result<Reader> {
        Reader::open(&self.inner.path)
    }

    /// What the writer has done so far.
    pub fn stats(&self) -> WriterStats {
        let c = &self.inner.counters;
        WriterStats {
            commands: c.commands.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            commits: c.commits.load(Ordering::Relaxed),
            events: c.events.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            failed_batches: c.failed_batches.load(Ordering::Relaxed),
            lock_waits: c.lock_waits.load(Ordering::Relaxed),
        }
    }

    /// Like [`EventLog::execute`], for callers outside an async runtime.
    ///
    /// # Panics
    ///
    /// When called from inside a tokio runtime (tokio forbids blocking there): use
    /// `execute` from async code.
    pub fn execute_blocking(&self, command: Command) -> Result<Reply, LogError> {
        let sender = self.sender().ok_or_else(closed)?;
        let (reply, answer) = oneshot::channel();
        sender.blocking_send(Job { command, reply }).map_err(|_| closed())?;
        drop(sender);
        answer.blocking_recv().map_err(|_| writer_gone())?
    }

    /// Closes the channel, lets the writer finish every queued command, and joins it.
    /// Every handle sees the store closed afterwards. Calling it twice is harmless.
    ///
    /// # Errors
    ///
    /// [`Error::WriterPanicked`] if the writer thread had panicked (a bug).
    pub fn shutdown(&self) -> Result<()> {
        self.inner.close()
    }

    fn sender(&self) -> Option<mpsc::Sender<Job>> {
        self.inner.sender.read().expect("the sender lock is never poisoned: nothing panics while holding it").clone()
    }
}

impl EventLog for Store {
    fn execute(&self, command: Command) -> BoxFuture<'_, Result<Reply, LogError>> {
        Box::pin(async move {
            let sender = self.sender().ok_or_else(closed)?;
            let (reply, answer) = oneshot::channel();
            sender.send(Job { command, reply }).await.map_err(|_| closed())?;
            drop(sender);
            answer.await.map_err(|_| writer_gone())?
        })
    }

    /// Opens the intent's vault entry with this store's vault key (given in
    /// [`Options::vault`]): one indexed read and one AES-GCM decryption, on a read-only
    /// connection of the handle's own.
    fn unseal<'a>(&'a self, key: &'a IntentKey) -> BoxFuture<'a, Unsealed> {
        Box::pin(async move {
            match &self.inner.vault {
                Some(unsealer) => unsealer.unseal(&self.inner.path, key),
                None => Unsealed::NoVault,
            }
        })
    }
}

/// What a command came to inside a batch, before the commit.
type Outcome = std::result::Result<ReplyTarget, Refusal>;

/// A batch that did not commit (or may not have).
struct BatchFailure {
    error: Error,
    maybe_committed: bool,
}

/// The service: owned by the writer thread alone.
struct Writer {
    conn: Connection,
    checkpointer: Checkpointer,
    /// Events committed since the checkpointer was last asked (`CHECKPOINT_NUDGE_EVENTS`).
    unchecked_events: u64,
    /// Where the log ends: every event up to it is checked (written here, or checked by
    /// catch-up or by the open-time tail check).
    chain: Chain,
    /// The verified point last recorded in `meta`.
    recorded: u64,
    cache: RefCell<Cache>,
    /// Actor names → ids: a handful per log (commands, operators, recovery). Cleared with
    /// the cache, and when it grows past `ENTITY_CACHE_MAX` names.
    actors: HashMap<String, i64>,
    clock: Arc<dyn Clock>,
    counters: Arc<Counters>,
    /// Set when re-reading the head after a failure failed too: nothing is decided until a
    /// later re-read succeeds.
    broken: Option<String>,
    /// Crash points inside a batch (disarmed outside crash tests).
    failpoints: engine::failpoints::Failpoints,
    /// How long a lease hold lasts.
    lease_ttl_ms: u64,
    /// How long a batch asks for a write lock another process holds.
    write_lock_patience_ms: u64,
    /// What the host can tell about other lease holders.
    owner_probe: Arc<dyn OwnerProbe>,
    /// The vault's key, checked at open: reservations' payment methods are sealed with it.
    vault: Option<VaultKey>,
    /// The slots of the vault entries the batch deleted: their data keys are zeroed once the
    /// deletion is committed (`vault`, "Ordering and crashes"), or at a later batch when that
    /// failed.
    freed_slots: RefCell<Vec<u64>>,
}

impl Writer {
    fn run(mut self, mut receiver: mpsc::Receiver<Job>) {
        let mut batch = Vec::with_capacity(WRITER_BATCH_MAX);
        // `None` once every sender is gone and the queue is empty: that is shutdown.
        while let Some(first) = receiver.blocking_recv() {
            batch.push(first);
            while batch.len() < WRITER_BATCH_MAX {
                match receiver.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            self.run_batch(&mut batch);
            debug_assert!(batch.is_empty(), "every job of a batch is answered");
        }
        if self.broken.is_none()
            && self.chain.last_seq > self.recorded
            && let Err(error) = chain::record_verified(&self.conn, self.chain.last_seq)
        {
            // Only the next open's cost depends on it: it checks a longer tail.
            tracing::warn!(%error, "could not record the verified point at shutdown");
        }
        tracing::debug!("store writer drained and stopped");
    }

    fn store(&self) -> tx::Store<'_> {
        tx::Store::new(&self.conn, &self.cache)
    }

    fn run_batch(&mut self, jobs: &mut Vec<Job>) {
        let now = self.clock.now().trunc_subsecs(6);
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        self.counters.commands.fetch_add(jobs.len() as u64, Ordering::Relaxed);
        match self.write_batch(jobs, now) {
            Ok(decisions) => {
                assert_eq!(decisions.len(), jobs.len(), "one decision per command");
                let store = self.store();
                let view = TxView::new(&store);
                for (job, decision) in jobs.drain(..).zip(decisions) {
                    let answer = match decision {
                        Ok(target) => Ok(engine::ledger::reply_after(&view, &target)),
                        Err(refusal) => Err(LogError::Refused(refusal)),
                    };
                    // A caller that stopped waiting (its future was dropped) needs no answer.
                    let _ = job.reply.send(answer);
                }
                if let Err(error) = view.finish() {
                    // The commit stands; only a reply's read failed. Forget what may be stale.
                    tracing::error!(%error, "reading a reply after the commit failed");
                    self.cache.borrow_mut().clear();
                }
            }
            Err(BatchFailure { error, maybe_committed }) => {
                self.counters.failed_batches.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%error, maybe_committed, commands = jobs.len(), "store batch failed");
                self.reload();
                let detail = error.to_string();
                for job in jobs.drain(..) {
                    let _ = job.reply.send(Err(LogError::Unavailable { detail: detail.clone(), maybe_committed }));
                }
            }
        }
    }

    /// Rolls back whatever is open, forgets every cached entity and re-reads the head: the
    /// database is the truth after a failed batch.
    fn reload(&mut self) {
        if !self.conn.is_autocommit()
            && let Err(error) = self.conn.execute_batch("ROLLBACK")
        {
            tracing::error!(%error, "rollback after a failed batch failed");
        }
        self.cache.borrow_mut().clear();
        self.actors.clear();
        // A data key the rolled-back batch wrote for a reservation is referenced by no entry;
        // the entries it deleted are still there. The sweep zeroes every key no entry needs.
        self.freed_slots.borrow_mut().clear();
        if let Err(error) = vault::sweep(&self.conn) {
            tracing::error!(%error, "erasing the vault's unreferenced data keys after a failed batch failed; the next open retries");
        }
        match codec::head(&self.conn) {
            Ok((last_seq, last_hash)) => {
                self.chain = Chain { last_seq, last_hash };
                self.broken = None;
            }
            Err(error) => {
                tracing::error!(%error, "re-reading the log's head failed: commands are refused until it succeeds");
                self.broken = Some(error.to_string());
            }
        }
    }

    fn write_batch(&mut self, jobs: &[Job], now: DateTime<Utc>) -> std::result::Result<Vec<Outcome>, BatchFailure> {
        if self.broken.is_some() {
            self.reload();
            if let Some(detail) = &self.broken {
                return Err(BatchFailure {
                    error: Error::corrupt(0, format!("the writer cannot read the log: {detail}")),
                    maybe_committed: false,
                });
            }
        }
        let not_committed = |error: Error| BatchFailure { error, maybe_committed: false };
        // IMMEDIATE takes the write lock now, so the catch-up below and every decision
        // after it see a log no other process can extend until we commit.
        self.begin_immediate().map_err(not_committed)?;
        self.catch_up().map_err(not_committed)?;
        // Counted after the catch-up: events another process appended are not ours.
        let events_before = self.chain.last_seq;
        let decisions = self.append_batch(jobs, now).map_err(not_committed)?;
        let appended = self.chain.last_seq - events_before;
        if self.chain.last_seq >= self.recorded + VERIFIED_MARK_EVENTS {
            chain::record_verified(&self.conn, self.chain.last_seq).map_err(not_committed)?;
        }
        if appended > 0 {
            // Decided and inserted, not committed: a crash here must lose the whole batch.
            self.failpoints.hit(Point::InBatchBeforeCommit);
        }
        self.conn.execute_batch("COMMIT").map_err(|e| BatchFailure { error: e.into(), maybe_committed: true })?;
        if self.chain.last_seq >= self.recorded + VERIFIED_MARK_EVENTS {
            self.recorded = self.chain.last_seq;
        }
        self.erase_freed_slots();
        if appended > 0 {
            // Durable, not acknowledged: callers never learn their commands succeeded.
            self.failpoints.hit(Point::AfterCommitBeforeAnswer);
            self.unchecked_events += appended;
            if self.unchecked_events >= CHECKPOINT_NUDGE_EVENTS {
                self.checkpointer.nudge();
                self.unchecked_events = 0;
            }
            self.counters.commits.fetch_add(1, Ordering::Relaxed);
            self.counters.events.fetch_add(appended, Ordering::Relaxed);
        }
        Ok(decisions)
    }

    /// Zeroes the data keys of the vault entries deleted by the commits so far, before their
    /// callers are answered: a final intent's payment method opens under no key once its
    /// caller hears it is final. When that fails (another process held the write lock past the
    /// busy timeout) the slots wait for the next batch, or for a sweep.
    fn erase_freed_slots(&self) {
        let slots = std::mem::take(&mut *self.freed_slots.borrow_mut());
        if let Err(error) = vault::erase_freed(&self.conn, &slots) {
            tracing::warn!(%error, slots = slots.len(), "zeroing the shredded vault entries' keys failed; the next batch retries");
            self.freed_slots.borrow_mut().extend(slots);
        }
    }

    /// `BEGIN IMMEDIATE`, asked again while another process holds the write lock, up to
    /// [`Options::write_lock_patience_ms`]: each try waits one busy timeout in SQLite's handler,
    /// and nothing is written before the lock is held.
    fn begin_immediate(&self) -> Result<()> {
        schema::with_write_lock_patience(
            self.write_lock_patience_ms,
            || self.conn.execute_batch("BEGIN IMMEDIATE").map_err(Error::from),
            |detail| {
                self.counters.lock_waits.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%detail, "another process holds the event log's write lock; asking again");
            },
        )
    }

    fn append_batch(&mut self, jobs: &[Job], now: DateTime<Utc>) -> Result<Vec<Outcome>> {
        let mut decisions = Vec::with_capacity(jobs.len());
        for job in jobs {
            let decision = self.append_command(&job.command, now)?;
            if decision.is_err() {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
            }
            decisions.push(decision);
        }
        Ok(decisions)
    }

    /// Checks the events another process appended since our last batch and forgets the
    /// cached entities of the streams they touched. Their entity rows were written by that
    /// process, in their own transaction.
    fn catch_up(&mut self) -> Result<()> {
        let (stored, _) = codec::head(&self.conn)?;
        let known = self.chain.last_seq;
        if stored < known {
            return Err(Error::corrupt(
                stored,
                format!("the log ends at seq {stored} but this writer has seen up to {known}"),
            ));
        }
        if stored > known {
            let store = tx::Store::new(&self.conn, &self.cache);
            let mut touched = Vec::new();
            let mut chain = self.chain.clone();
            codec::scan_events(&self.conn, known, |event| {
                chain.check(&self.conn, &event, true)?;
                touched.push(event.stream.clone());
                if let Event::AttemptStarted { run_id, .. } = &event.event {
                    // A network retry also changes the run that makes it.
                    touched.push(run_id.stream());
                }
                Ok(())
            })?;
            for name in touched {
                if let Some(id) = store.id(&name)? {
                    self.cache.borrow_mut().forget(id);
                }
            }
            tracing::debug!(events = chain.last_seq - known, "store writer caught up with another process");
            self.chain = chain;
        }
        Ok(())
    }

    /// The vault's part of an accepted command, in its transaction: the entry of every intent
    /// the command made final is deleted (crypto-shredding), and a reservation's payment
    /// method is sealed beside its intent unless the intent is final.
    fn vault_after(
        &self,
        store: &tx::Store<'_>,
        command: &Command,
        sealed: &[Sealed],
        now: DateTime<Utc>,
    ) -> Result<()> {
        let mut seen = std::collections::BTreeSet::new();
        for Sealed { stored, .. } in sealed {
            let Some(key) = stored.event.intent_key() else { continue };
            if !seen.insert(key) {
                continue;
            }
            if let Some((_, intent)) = store.intent(key)?
                && intent.settled()
            {
                self.freed_slots.borrow_mut().extend(vault::shred(&self.conn, key)?);
            }
        }
        if let (Some(vault_key), Some(secret), Action::Reserve { spec, .. }) =
            (&self.vault, &command.keep, &command.action)
        {
            let key = &spec.definition.key;
            if let Some((_, intent)) = store.intent(key)?
                && !intent.settled()
                && !vault::keep(&self.conn, vault_key, key, secret, now)?
            {
                tracing::warn!(
                    effect.idempotency_key_hash = %key.hash(),
                    "the vault was rotated to another key since this process opened it: the payment method is not kept"
                );
            }
        }
        Ok(())
    }

    /// Decides one command and appends its events. `Ok(Err(refusal))`: nothing written.
    fn append_command(&mut self, command: &Command, now: DateTime<Utc>) -> Result<Outcome> {
        let store = tx::Store::new(&self.conn, &self.cache);
        let leases = leases::TableView::new(&self.conn, &*self.owner_probe, self.lease_ttl_ms);
        let view = TxView::new(&store);
        let decided = engine::ledger::decide(&view, &leases, command, now);
        leases.finish()?;
        let Decision { events, target, leases: lease_effects } = match decided {
            Ok(decision) => decision,
            Err(refusal) => return view.finish().map(|()| Err(refusal)),
        };
        let head = Head { last_seq: self.chain.last_seq, last_hash: &self.chain.last_hash };
        let mut unread = None;
        let mut seq_of = |tail: Tail<'_>, end: End| match (tail, end) {
            (Tail::Intent(key), End::Latest) => view.intent(key).map(|i| i.last_seq),
            (Tail::Run(run_id), End::Latest) => view.run(run_id).map(|r| r.last_seq),
            (Tail::Intent(key), End::First) => first_seq(&self.conn, &key.stream(), &mut unread),
            (Tail::Run(run_id), End::First) => first_seq(&self.conn, &run_id.stream(), &mut unread),
        };
        let sealed = seal(
            events,
            &command.cause,
            now,
            Chaining::Global(head),
            &mut |stream| view.stream_length(stream),
            &mut seq_of,
        );
        if let Some(error) = unread {
            return Err(error);
        }
        view.finish()?;
        let sealed = match sealed {
            Ok(sealed) => sealed,
            Err(refusal) => return Ok(Err(refusal)),
        };
        leases::apply(&self.conn, &lease_effects)?;
        let at = codec::micros(now);
        let actor = match self.actors.get(&command.cause.actor) {
            Some(&id) => id,
            None => {
                let id = codec::ensure_actor(&self.conn, &command.cause.actor)?;
                if self.actors.len() >= ENTITY_CACHE_MAX {
                    self.actors.clear();
                }
                self.actors.insert(command.cause.actor.clone(), id);
                id
            }
        };
        let cause_run = command.cause.run_id.as_ref().map(|run| store.ensure_id(&run.stream())).transpose()?;
        let mut entities = TxEntities::new(&store);
        let mut last = None;
        for Sealed { stored, .. } in &sealed {
            let stream = store.ensure_id(&stored.stream)?;
            let payload = codec::pack_payload(&stored.stream, &stored.event);
            let hash = codec::hash_bytes(&stored.hash);
            codec::insert_event(
                &self.conn,
                &NewEvent {
                    seq: stored.seq,
                    stream,
                    stream_name: stored.stream.as_str(),
                    stream_seq: stored.stream_seq,
                    type_code: codec::type_code(stored.event.type_name()),
                    at,
                    actor,
                    cause_run,
                    cause_parent: stored.cause.parent,
                    payload: &payload,
                    hash: &hash,
                },
            )?;
            store.set_length(stream, stored.stream_seq);
            // Folded at once, so the next command of the batch is decided against it.
            if let Err(error) = fold::apply(&mut entities, stored) {
                panic!("{error}");
            }
            last = Some(stored);
        }
        entities.write_back(now)?;
        self.vault_after(&store, command, &sealed, now)?;
        if let Some(last) = last {
            self.chain = Chain { last_seq: last.seq, last_hash: last.hash.clone() };
        }
        Ok(Ok(target))
    }
}

/// The first sequence of `stream` (`None` when it has no event yet), keeping the first read
/// error in `unread` for the caller to fail the batch with.
fn first_seq(conn: &rusqlite::Connection, stream: &StreamId, unread: &mut Option<Error>) -> Option<u64> {
    match codec::first_seq(conn, stream) {
        Ok(seq) => seq,
        Err(error) => {
            unread.get_or_insert(error);
            None
        }
    }
}
