//! The physical limit the writer is measured against: `cargo run --release -p store --example
//! raw_append -- [CHARGES] [ROWS_PER_CHARGE] [CHARGES_PER_COMMIT] [full|normal]`.
//!
//! Plain SQLite, nothing of Keel's: one connection in WAL mode at the given `synchronous`,
//! appending rows shaped like the compact `events` table (integer seq, stream, stream_seq,
//! type, time and actor, a 120-byte payload blob and a 32-byte hash, `UNIQUE(stream,
//! stream_seq)`), `ROWS_PER_CHARGE` rows per charge (default 3), `CHARGES_PER_COMMIT` charges
//! per transaction (default 100), one fsync per commit at `full`. It prints charges/s and rows/s:
//! what the disk and SQLite allow, to set `keel bench`'s figure against. Nothing is asserted.
//! The system clock is read here only to time the run.

use rusqlite::{Connection, params};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let charges: u64 = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let rows_per_charge: u64 = args.next().map_or(Ok(3), |a| a.parse())?;
    let per_commit: u64 = args.next().map_or(Ok(100), |a| a.parse())?;
    let synchronous = match args.next().as_deref() {
        Some("normal") => "NORMAL",
        _ => "FULL",
    };
    let dir = tempfile::tempdir_in(".")?;
    let conn = Connection::open(dir.path().join("raw.db"))?;
    // The writer's own settings: WAL, the chosen synchronous, the same page cache.
    conn.pragma_update_and_check(None, "journal_mode", "WAL", |_| Ok(()))?;
    conn.pragma_update(None, "synchronous", synchronous)?;
    conn.pragma_update(None, "cache_size", -32_768)?;
    conn.execute_batch(
        "CREATE TABLE events (seq INTEGER PRIMARY KEY, stream INTEGER NOT NULL, stream_seq INTEGER NOT NULL, \
         type INTEGER NOT NULL, at INTEGER NOT NULL, actor INTEGER NOT NULL, payload BLOB NOT NULL, \
         hash BLOB NOT NULL, UNIQUE (stream, stream_seq)) STRICT;",
    )?;
    let payload = vec![0x5au8; 120];
    let hash = [0xa5u8; 32];
    let began = Instant::now();
    let mut seq = 0i64;
    let mut charge = 0u64;
    while charge < charges {
        let tx = conn.unchecked_transaction()?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO events (seq, stream, stream_seq, type, at, actor, payload, hash) \
                 VALUES (?1, ?2, ?3, 1, 1767225600000000, 1, ?4, ?5)",
            )?;
            for _ in 0..per_commit.min(charges - charge) {
                for row in 0..rows_per_charge {
                    seq += 1;
                    insert.execute(params![seq, charge as i64, row as i64 + 1, payload, hash])?;
                }
                charge += 1;
            }
        }
        tx.commit()?;
    }
    let seconds = began.elapsed().as_secs_f64();
    println!(
        "raw SQLite, WAL, synchronous={synchronous}: {charges} charges × {rows_per_charge} rows, {per_commit} per commit: \
         {seconds:.2} s, {:.0} charges/s, {:.0} rows/s, {:.0} commits/s",
        charges as f64 / seconds,
        (charges * rows_per_charge) as f64 / seconds,
        charges as f64 / per_commit as f64 / seconds,
    );
    Ok(())
}
