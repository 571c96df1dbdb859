//! The chain's head, and the check of every event that extends it.
//!
//! Owns [`Chain`] — the last sequence and hash a writer has seen — and [`Chain::check`], the
//! conditions under which an event read back extends it: the next sequence, chained to the
//! last hash, its hash the chain hash of its own content, on the stream its event belongs
//! on, and (when asked) the next in its stream. The writer applies it to the unverified tail
//! at open ([`open_checked`]) and to every event another process appended (catch-up);
//! `verify` applies it to every event.
//!
//! The verified point (`meta.verified_seq`, [`record_verified`]) bounds what the next open
//! checks: every event up to it was checked by a writer, or written by one.

use crate::codec;
use crate::error::{Error, Result};
use engine::event::StoredEvent;
use rusqlite::{Connection, OptionalExtension};

/// Where the log ends, as far as a writer has checked it.
#[derive(Clone, Debug)]
pub(crate) struct Chain {
    /// The last global sequence (0 for an empty log).
    pub(crate) last_seq: u64,
    /// Its hash (the genesis hash for an empty log).
    pub(crate) last_hash: String,
}

impl Chain {
    /// Checks that `stored` extends the chain, then extends it. `in_stream` also checks that
    /// it follows the previous event of its stream (one index lookup; `verify` checks streams
    /// in their own pass instead).
    pub(crate) fn check(&mut self, conn: &Connection, stored: &StoredEvent, in_stream: bool) -> Result<()> {
        let seq = stored.seq;
        if seq != self.last_seq + 1 {
            return Err(Error::corrupt(seq, format!("expected seq {} next (gap or duplicate)", self.last_seq + 1)));
        }
        let belongs = stored.event.stream();
        if stored.stream != belongs {
            return Err(Error::corrupt(
                seq,
                format!("stored on stream {} but the event belongs on {belongs}", stored.stream),
            ));
        }
        if stored.prev_hash != self.last_hash {
            return Err(Error::corrupt(
                seq,
                format!("prev_hash mismatch (stored {}, previous event's hash {})", stored.prev_hash, self.last_hash),
            ));
        }
        codec::check_hash(stored)?;
        if in_stream && !codec::follows_in_stream(conn, &stored.stream, stored.stream_seq, seq)? {
            return Err(Error::corrupt(
                seq,
                format!(
                    "stream_seq {} on stream {} does not follow its previous event",
                    stored.stream_seq, stored.stream
                ),
            ));
        }
        self.last_seq = seq;
        self.last_hash.clone_from(&stored.hash);
        Ok(())
    }
}

/// The verified point recorded in `meta`.
fn recorded(conn: &Connection) -> Result<u64> {
    let text: Option<String> = conn
        .prepare_cached("SELECT value FROM meta WHERE key = 'verified_seq'")?
        .query_row([], |row| row.get(0))
        .optional()?;
    let text = text.ok_or_else(|| Error::corrupt(0, "meta has no verified_seq"))?;
    text.parse().map_err(|_| Error::corrupt(0, format!("meta verified_seq {text:?} is not a sequence")))
}

/// Records that every event up to `seq` is checked (inside the caller's transaction, or as
/// its own).
pub(crate) fn record_verified(conn: &Connection, seq: u64) -> Result<()> {
    conn.prepare_cached("UPDATE meta SET value = ?1 WHERE key = 'verified_seq'")?.execute([seq.to_string()])?;
    Ok(())
}

/// Reads the head and checks the events after the verified point, in one read snapshot.
/// Returns the checked chain and the recorded point.
pub(crate) fn open_checked(conn: &Connection) -> Result<(Chain, u64)> {
    let snapshot = conn.unchecked_transaction()?;
    let recorded = recorded(&snapshot)?;
    let (head, _) = codec::head(&snapshot)?;
    if head < recorded {
        return Err(Error::corrupt(head, format!("the log ends at seq {head}, before its verified point {recorded}")));
    }
    let last_hash = codec::hash_at(&snapshot, recorded)?
        .ok_or_else(|| Error::corrupt(recorded, "the verified point's event is missing"))?;
    let mut chain = Chain { last_seq: recorded, last_hash };
    codec::scan_events(&snapshot, recorded, |stored| chain.check(&snapshot, &stored, true))?;
    if chain.last_seq != head {
        return Err(Error::corrupt(chain.last_seq + 1, format!("the log's head is seq {head}: events are missing")));
    }
    snapshot.finish()?;
    Ok((chain, recorded))
}
