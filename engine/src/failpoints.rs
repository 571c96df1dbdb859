//! Named crash points at every event boundary, for crash-replay tests.
//!
//! Owns [`Point`] (every boundary where a process may die between two durable facts, or
//! between a durable fact and the act it licenses) and [`Failpoints`], the configuration the
//! executor and the store receive: which point is armed, on which hit, and the *hook* to call
//! when it fires. It is pure data plus a function: this module never reads the environment
//! (the binary parses `KEEL_FAILPOINT` once and passes the result in) and never ends the
//! process itself — the binary's hook calls `std::process::abort()`, so no destructor runs,
//! no buffer is flushed and no `Drop` commits or rolls back anything: the process is simply
//! gone, which is what a crash is. In-process harnesses (the `testkit` crate) install a hook
//! that panics instead.
//!
//! Disarmed (the default), a failpoint costs one `Option` check.
//!
//! ```
//! use engine::failpoints::{Failpoints, Point};
//! let spec = Failpoints::parse_spec("after_attempt_started:2").unwrap();
//! assert_eq!(spec, (Point::AfterAttemptStarted, 2));
//! assert!(Failpoints::parse_spec("nowhere").is_err());
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// A boundary between two durable steps where a crash is interesting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Point {
    /// The reservation is committed; the first attempt is not yet written.
    AfterReservation,
    /// `AttemptStarted` is committed; the provider has not been called.
    AfterAttemptStarted,
    /// The provider answered; its outcome is not yet written.
    AfterProviderAnswer,
    /// `ReconciliationStarted` is committed; the lookup has not been sent.
    AfterReconciliationStarted,
    /// The lookup answered; its result is not yet written.
    AfterLookup,
    /// A billed call's answer (`Context::billed_call`, a model's) is committed; the workflow
    /// has not used it yet.
    AfterCallAnswered,
    /// A workflow's `TimerStarted` is committed; the run has not begun waiting on it (a
    /// crash while a run sleeps).
    AfterTimerStarted,
    /// Recovery committed its `OutcomeUnknown (crash)` facts; runs are not yet resumed and
    /// nothing is reconciled.
    AfterRecover,
    /// Inside a group-commit batch: the batch's commands are decided and their events
    /// inserted, `COMMIT` has not run (the whole batch must vanish).
    InBatchBeforeCommit,
    /// `COMMIT` returned; the batch's callers have not been answered.
    AfterCommitBeforeAnswer,
}

impl Point {
    /// Every point, in the order of an intent's life.
    pub const ALL: [Point; 10] = [
        Point::AfterReservation,
        Point::AfterAttemptStarted,
        Point::AfterProviderAnswer,
        Point::AfterReconciliationStarted,
        Point::AfterLookup,
        Point::AfterCallAnswered,
        Point::AfterTimerStarted,
        Point::AfterRecover,
        Point::InBatchBeforeCommit,
        Point::AfterCommitBeforeAnswer,
    ];

    /// The point's stable name, as `KEEL_FAILPOINT` spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::AfterReservation => "after_reservation",
            Self::AfterAttemptStarted => "after_attempt_started",
            Self::AfterProviderAnswer => "after_provider_answer",
            Self::AfterReconciliationStarted => "after_reconciliation_started",
            Self::AfterLookup => "after_lookup",
            Self::AfterCallAnswered => "after_call_answered",
            Self::AfterTimerStarted => "after_timer_started",
            Self::AfterRecover => "after_recover",
            Self::InBatchBeforeCommit => "in_batch_before_commit",
            Self::AfterCommitBeforeAnswer => "after_commit_before_answer",
        }
    }

    /// Parses a name produced by [`Point::name`].
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|p| p.name() == name)
    }
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What runs when an armed point fires. The binary's hook aborts the process.
pub type Hook = Arc<dyn Fn(Point) + Send + Sync>;

/// Which point is armed, on which hit, and what firing does. Cheap to clone: clones share
/// the hit counter, so "the Nth hit" counts across the executor and the store of a process.
#[derive(Clone, Default)]
pub struct Failpoints {
    armed: Option<Armed>,
}

#[derive(Clone)]
struct Armed {
    point: Point,
    nth: u32,
    hits: Arc<AtomicU32>,
    hook: Hook,
}

impl fmt::Debug for Failpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.armed {
            None => f.write_str("Failpoints(disarmed)"),
            Some(armed) => write!(f, "Failpoints({}:{})", armed.point, armed.nth),
        }
    }
}

impl Failpoints {
    /// No point armed: every [`Failpoints::hit`] is a no-op.
    pub fn disarmed() -> Self {
        Self::default()
    }

    /// Arms `point` to call `hook` on its `nth` hit (1-based; 0 is read as 1).
    pub fn armed(point: Point, nth: u32, hook: Hook) -> Self {
        Self { armed: Some(Armed { point, nth: nth.max(1), hits: Arc::new(AtomicU32::new(0)), hook }) }
    }

    /// Parses `NAME` or `NAME:N` (fire on the Nth hit).
    ///
    /// # Errors
    ///
    /// A message naming the known points when the name or the count does not parse.
    pub fn parse_spec(spec: &str) -> Result<(Point, u32), String> {
        let (name, nth) = match spec.split_once(':') {
            Some((name, n)) => (name, n.parse::<u32>().map_err(|_| format!("{n:?} is not a hit count"))?),
            None => (spec, 1),
        };
        let known = || Point::ALL.iter().map(Point::name).collect::<Vec<_>>().join(", ");
        let point =
            Point::parse(name.trim()).ok_or_else(|| format!("unknown failpoint {name:?} (known: {})", known()))?;
        Ok((point, nth.max(1)))
    }

    /// The armed point, if any.
    pub fn point(&self) -> Option<Point> {
        self.armed.as_ref().map(|a| a.point)
    }

    /// Marks one pass through `point`; calls the hook when it is the armed point's Nth pass.
    /// The hook is expected not to return (abort, or panic in a harness).
    pub fn hit(&self, point: Point) {
        if let Some(armed) = &self.armed
            && armed.point == point
            && armed.hits.fetch_add(1, Ordering::SeqCst) + 1 == armed.nth
        {
            (armed.hook)(point);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn fires_on_the_nth_hit_of_its_own_point_only() {
        let fired = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&fired);
        let fp =
            Failpoints::armed(Point::AfterLookup, 2, Arc::new(move |p| seen.lock().expect("not poisoned").push(p)));
        let clone = fp.clone();
        fp.hit(Point::AfterRecover);
        fp.hit(Point::AfterLookup);
        assert!(fired.lock().expect("not poisoned").is_empty());
        clone.hit(Point::AfterLookup);
        assert_eq!(*fired.lock().expect("not poisoned"), vec![Point::AfterLookup]);
        fp.hit(Point::AfterLookup);
        assert_eq!(fired.lock().expect("not poisoned").len(), 1, "fires once");
    }

    #[test]
    fn every_name_round_trips() {
        for point in Point::ALL {
            assert_eq!(Point::parse(point.name()), Some(point));
            assert_eq!(Failpoints::parse_spec(&format!("{point}:3")), Ok((point, 3)));
        }
        assert!(Failpoints::parse_spec("after_lookup:x").is_err());
        Failpoints::disarmed().hit(Point::AfterLookup);
    }
}
