//! Time as an input.
//!
//! Owns the [`Clock`] trait every time-dependent decision reads through, [`ManualClock`], a
//! forward-only clock tests drive by hand, and the instant arithmetic every caller uses
//! ([`checked_plus_ms`], [`ms_between`]). Nothing in this crate reads the system clock: the
//! binary supplies the real one. Deadlines are absolute UTC instants, persisted in events.
//!
//! # Arithmetic
//!
//! An instant plus a duration can leave what `DateTime<Utc>` holds (about 262 000 years
//! around year 0): [`checked_plus_ms`] says so with `None` instead of panicking or clamping.
//! Callers refuse such a duration (a usage error at the binary, a refusal in the ledger);
//! the durations Keel accepts at its doors are bounded in [`crate::limits`] well inside it.

use crate::provider::BoxFuture;
use chrono::{DateTime, TimeDelta, Utc};
use std::sync::Mutex;

/// A source of the current UTC instant, and of waiting.
pub trait Clock: Send + Sync + 'static {
    /// The current instant. Successive calls never go backwards.
    fn now(&self) -> DateTime<Utc>;

    /// Waits `ms` milliseconds of this clock's time. The default waits in real time (tokio);
    /// a [`ManualClock`] moves itself forward instead, so tests never wait.
    fn sleep_ms(&self, ms: u64) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(std::time::Duration::from_millis(ms)))
    }
}

/// A clock that only moves when told to. Never goes backwards.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
}

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self { now: Mutex::new(start) }
    }

    /// Moves the clock forward by `ms` milliseconds.
    ///
    /// # Panics
    ///
    /// When `ms` is negative or the clock would leave chrono's range: a test tool's misuse.
    pub fn advance_ms(&self, ms: i64) {
        assert!(ms >= 0, "a manual clock never goes backwards");
        let mut now = self.now.lock().expect("the clock mutex is never poisoned: no code panics while holding it");
        *now = checked_plus_ms(*now, ms.unsigned_abs()).expect("a test advances a manual clock within chrono's range");
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().expect("the clock mutex is never poisoned: no code panics while holding it")
    }

    fn sleep_ms(&self, ms: u64) -> BoxFuture<'_, ()> {
        self.advance_ms(i64::try_from(ms).unwrap_or(i64::MAX));
        Box::pin(std::future::ready(()))
    }
}

/// `at` in whole microseconds since the epoch, rounded up: how a store's indexed column keeps
/// a fire time (from a clock that may count nanoseconds) so that, against a decision's instant
/// (whole microseconds), `column <= now` says exactly what `at <= now` says.
pub fn micros_rounded_up(at: DateTime<Utc>) -> i64 {
    let floor = at.timestamp_micros();
    if at.timestamp_subsec_nanos().is_multiple_of(1_000) { floor } else { floor.saturating_add(1) }
}

/// Milliseconds from `from` to `to`, zero when `to` is not later. Never panics: any two
/// instants are less than `i64::MAX` milliseconds apart.
pub fn ms_between(from: DateTime<Utc>, to: DateTime<Utc>) -> u64 {
    u64::try_from((to - from).num_milliseconds()).unwrap_or(0)
}

/// `at` plus `ms` milliseconds, or `None` when the result is not a representable instant.
///
/// ```
/// use chrono::{DateTime, Utc};
/// use engine::clock::checked_plus_ms;
/// let epoch = DateTime::<Utc>::UNIX_EPOCH;
/// assert_eq!(checked_plus_ms(epoch, 1_500).map(|t| t.timestamp_millis()), Some(1_500));
/// assert_eq!(checked_plus_ms(epoch, u64::MAX), None);
/// assert_eq!(checked_plus_ms(epoch, 9_000_000_000_000_000), None);
/// ```
pub fn checked_plus_ms(at: DateTime<Utc>, ms: u64) -> Option<DateTime<Utc>> {
    let delta = TimeDelta::try_milliseconds(i64::try_from(ms).ok()?)?;
    at.checked_add_signed(delta)
}

/// `at` minus `ms` milliseconds, or `None` when that is before the earliest representable
/// instant (an age limit that long holds everything).
///
/// ```
/// use chrono::{DateTime, Utc};
/// use engine::clock::checked_minus_ms;
/// let epoch = DateTime::<Utc>::UNIX_EPOCH;
/// assert_eq!(checked_minus_ms(epoch, 1_500).map(|t| t.timestamp_millis()), Some(-1_500));
/// assert_eq!(checked_minus_ms(epoch, u64::MAX), None);
/// ```
pub fn checked_minus_ms(at: DateTime<Utc>, ms: u64) -> Option<DateTime<Utc>> {
    let delta = TimeDelta::try_milliseconds(i64::try_from(ms).ok()?)?;
    at.checked_sub_signed(delta)
}

/// `at` plus `ms` milliseconds, the latest representable instant when that is out of range.
/// Kept for the agent harness until it moves to [`checked_plus_ms`], which every other
/// caller uses: a clamped deadline is a deadline that never comes.
pub fn plus_ms(at: DateTime<Utc>, ms: u64) -> DateTime<Utc> {
    checked_plus_ms(at, ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}
