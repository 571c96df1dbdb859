//! The WAL checkpointer: copies committed WAL frames into the database file off the writer's
//! critical path.
//!
//! Owns one thread with its own connection. SQLite's automatic checkpoint would run inside
//! the writer's COMMIT (15% of the writer's time under load, measured with `perf` on `keel
//! bench`), delaying every caller of that batch; the writer nudges this thread instead, once
//! every `engine::limits::CHECKPOINT_NUDGE_EVENTS` committed events (after every commit, its
//! fsyncs and page copies competed with the writer's own: at one caller, a third of the
//! process's samples), and keeps the inline checkpoint only as a bound
//! (`schema::WAL_AUTOCHECKPOINT_PAGES`) for when this thread falls behind. A PASSIVE
//! checkpoint never blocks the writer or readers. Nudges coalesce (a channel of one), so a
//! busy writer gets back-to-back checkpoints, an idle one none.
//!
//! It must never write anything but checkpoints: it does not touch tables, and a failed
//! checkpoint only delays the WAL's reuse (logged, retried at the next nudge).

use crate::error::Result;
use rusqlite::Connection;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;

/// A handle the writer nudges every `CHECKPOINT_NUDGE_EVENTS` committed events; dropping it
/// stops the thread.
pub(crate) struct Checkpointer {
    nudge: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts the thread on its own connection to `path`.
    pub(crate) fn start(path: &Path, busy_timeout_ms: u64) -> Result<Self> {
        let conn = Connection::open(path)?;
        // A checkpoint may wait briefly for a reader's snapshot to finish with a page.
        conn.busy_timeout(std::time::Duration::from_millis(busy_timeout_ms))?;
        let (nudge, nudges) = sync_channel(1);
        let thread =
            std::thread::Builder::new().name("keel-store-checkpoint".to_owned()).spawn(move || run(&conn, &nudges))?;
        Ok(Self { nudge: Some(nudge), thread: Some(thread) })
    }

    /// Asks for a checkpoint soon; never blocks.
    pub(crate) fn nudge(&self) {
        if let Some(nudge) = &self.nudge {
            match nudge.try_send(()) {
                Ok(()) | Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => tracing::warn!("the WAL checkpointer has stopped"),
            }
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.nudge.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the WAL checkpointer panicked");
        }
    }
}

fn run(conn: &Connection, nudges: &Receiver<()>) {
    while nudges.recv().is_ok() {
        if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(%error, "WAL checkpoint failed; the next commit retries");
        }
    }
}
