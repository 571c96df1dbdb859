//! Time as an input.
//!
//! Owns the [`Clock`] trait every time-dependent decision reads through, and [`ManualClock`],
//! a forward-only clock tests drive by hand. Nothing in this crate reads the system clock:
//! the binary supplies the real one. Deadlines are absolute UTC instants, persisted in events.

use chrono::{DateTime, TimeDelta, Utc};
use std::sync::Mutex;

/// A source of the current UTC instant.
pub trait Clock: Send + Sync + 'static {
    /// The current instant. Successive calls never go backwards.
    fn now(&self) -> DateTime<Utc>;
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
    pub fn advance_ms(&self, ms: i64) {
        assert!(ms >= 0, "a manual clock never goes backwards");
        let mut now = self.now.lock().expect("the clock mutex is never poisoned: no code panics while holding it");
        *now += TimeDelta::milliseconds(ms);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().expect("the clock mutex is never poisoned: no code panics while holding it")
    }
}

/// Milliseconds from `from` to `to`, saturating at zero when `to` is earlier.
pub fn ms_between(from: DateTime<Utc>, to: DateTime<Utc>) -> u64 {
    u64::try_from((to - from).num_milliseconds()).unwrap_or(0)
}

/// `at` plus `ms` milliseconds.
pub fn plus_ms(at: DateTime<Utc>, ms: u64) -> DateTime<Utc> {
    at + TimeDelta::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX / 2))
}

/// `at` plus `ms` milliseconds, or `None` when the instant cannot be represented: a bound
/// taken from a caller (a deadline) is checked here rather than overflowing.
pub fn checked_plus_ms(at: DateTime<Utc>, ms: u64) -> Option<DateTime<Utc>> {
    at.checked_add_signed(TimeDelta::try_milliseconds(i64::try_from(ms).ok()?)?)
}
