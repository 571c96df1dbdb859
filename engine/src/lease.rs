//! Run leases: who may act for a run, and the fencing token that refuses a stale owner.
//!
//! Owns [`LeaseOwner`] (a process's identity), [`LeaseRow`] (a run's holder, fencing token
//! and expiry), [`LeaseGrant`] (what a holder presents with every write it makes for the
//! run), [`LeaseUse`] (how a command relates to a lease), [`Liveness`] and [`OwnerProbe`]
//! (what the host can tell about another process), [`LeaseView`] (what the ledger reads about
//! leases inside the transaction), [`LeaseEffect`] (what the store writes back), [`Lessee`]
//! (one process's book of grants) and [`claim_verdict`], the one rule deciding whether a run
//! may be taken.
//!
//! # The rule
//!
//! A run's lease is operational state the store keeps beside the log, outside the hash chain:
//! who holds it, a fencing token that grows at every acquisition (1, 2, …) and never goes
//! back, and an expiry the holder renews. The process that starts a run holds it with token 1
//! (`RunStarted` names that owner, for the record). The hold is *live* while its expiry lies
//! in the future and the host cannot prove the owner dead. A run whose hold is not live may be
//! claimed with the next token. A write for a run (reservation, attempt, lookup, journal step,
//! agent fact, finish) must present the current token: a stale holder's write is refused
//! (`Refusal::Fenced`), so a worker that was presumed dead and wakes up cannot act for a run
//! another process took. An attempt's *answer* is never fenced: a definitive provider answer
//! is evidence whoever brings it. Claims, renewals and releases never append an event, so
//! polling a suspended run never grows the log.
//!
//! # Clocks
//!
//! Expiries are instants of the writer's clock. Between processes on one machine they share
//! that clock, and a dead owner is proven dead by the probe at once. Between machines, a
//! lease only works if clocks drift less than the lease's time to live; a holder renews at a
//! third of it, so it stays live through two missed renewals.
//!
//! This module is pure: it does no I/O and reads no clock; the store and the binary do.

use crate::event::RunId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// A process that may hold leases: host, process id, the process's start time (so a reused
/// pid is not mistaken for the owner), and a random nonce (so two executors in one process —
/// a test's crash and restart — are two owners).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LeaseOwner {
    /// The host name.
    pub host: String,
    /// The operating system's process id.
    pub pid: u32,
    /// The process's start time as the host counts it (Linux: clock ticks since boot).
    pub started: u64,
    /// Random, per executor.
    pub nonce: String,
}

impl LeaseOwner {
    /// An owner known by a name only, for in-process harnesses and tests: no host can tell
    /// whether it runs, so its leases are taken only once expired (or by a probe told so).
    pub fn named(name: &str) -> Self {
        Self { host: String::new(), pid: 0, started: 0, nonce: name.to_owned() }
    }
}

impl fmt::Display for LeaseOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.is_empty() {
            write!(f, "owner {}", self.nonce)
        } else {
            write!(f, "pid {} on {}", self.pid, self.host)
        }
    }
}

/// A run's lease as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeaseRow {
    /// The current (or last) holder.
    pub owner: LeaseOwner,
    /// The fencing token: 1 for the run's starter, +1 at every claim, never reused.
    pub token: u64,
    /// Until when the hold is live unless renewed; `None` once released.
    pub expires_at: Option<DateTime<Utc>>,
}

/// What a holder presents with a write: the run and the token it was granted.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct LeaseGrant {
    /// The run.
    pub run_id: RunId,
    /// The fencing token.
    pub token: u64,
}

/// How a command relates to a run's lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LeaseUse {
    /// No lease: reads, operator decisions on intents, answers (never fenced).
    #[default]
    None,
    /// The command writes for the grant's run: refused if the token is no longer current.
    Hold(LeaseGrant),
    /// Like `Hold`, and the lease is released after the command (the run finished, or this
    /// process is done with it).
    Release(LeaseGrant),
}

impl LeaseUse {
    /// The grant presented, if any.
    pub fn grant(&self) -> Option<&LeaseGrant> {
        match self {
            Self::None => None,
            Self::Hold(grant) | Self::Release(grant) => Some(grant),
        }
    }
}

/// What the host can tell about a lease owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// The owner's process runs.
    Alive,
    /// The owner's process is proven gone (same host, no such process, or a zombie).
    Dead,
    /// The host cannot tell (another machine, no probe): only the expiry counts.
    Unknown,
}

/// Tells whether a lease owner still runs. The binary's probe reads `/proc`; tests use fakes.
pub trait OwnerProbe: Send + Sync {
    /// The owner's liveness as this host sees it.
    fn liveness(&self, owner: &LeaseOwner) -> Liveness;
}

/// A probe that can tell nothing: leases are taken only once they expire.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExpiryOnly;

impl OwnerProbe for ExpiryOnly {
    fn liveness(&self, _owner: &LeaseOwner) -> Liveness {
        Liveness::Unknown
    }
}

/// A probe for in-process harnesses that simulate a crash by starting over in the same
/// process: the owner named here runs, every other one is dead.
#[derive(Clone, Debug)]
pub struct SoleSurvivor(pub LeaseOwner);

impl OwnerProbe for SoleSurvivor {
    fn liveness(&self, owner: &LeaseOwner) -> Liveness {
        if owner == &self.0 { Liveness::Alive } else { Liveness::Dead }
    }
}

/// What the ledger reads about leases while it decides, inside the store's transaction.
pub trait LeaseView {
    /// The lease of `run_id` (`None`: never held — a run from before leases, unfenced).
    fn holder(&self, run_id: &RunId) -> Option<LeaseRow>;
    /// What the host can tell about `owner`.
    fn liveness(&self, owner: &LeaseOwner) -> Liveness;
    /// How long a new or renewed hold lasts.
    fn ttl_ms(&self) -> u64;
}

/// A lease change the store applies in the same transaction as the command's events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseEffect {
    /// `owner` holds the run with `token` until `expires_at` (a start, a claim, a renewal).
    Hold {
        /// The run.
        run_id: RunId,
        /// The holder.
        owner: LeaseOwner,
        /// Its token.
        token: u64,
        /// Until when.
        expires_at: DateTime<Utc>,
    },
    /// The run's hold ends now (its token stays, so the next claim takes the one after).
    Release {
        /// The run.
        run_id: RunId,
    },
}

/// Whether a run may be taken by `claimant` now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimVerdict {
    /// Nobody holds it live: claim it with the next token.
    Free,
    /// The claimant holds it already, with this token.
    Held(u64),
    /// Someone else holds it live.
    HeldElsewhere {
        /// The live holder.
        owner: LeaseOwner,
        /// Until when, unless renewed.
        expires_at: DateTime<Utc>,
    },
}

/// The one rule: a run is free unless its holder's expiry is in the future and the host
/// cannot prove that holder dead.
pub fn claim_verdict(
    holder: Option<&LeaseRow>,
    claimant: &LeaseOwner,
    now: DateTime<Utc>,
    liveness: impl Fn(&LeaseOwner) -> Liveness,
) -> ClaimVerdict {
    let Some((holder, expires_at)) = holder.and_then(|h| h.expires_at.map(|at| (h, at))) else {
        return ClaimVerdict::Free;
    };
    if expires_at <= now {
        return ClaimVerdict::Free;
    }
    if &holder.owner == claimant {
        return ClaimVerdict::Held(holder.token);
    }
    if liveness(&holder.owner) == Liveness::Dead {
        return ClaimVerdict::Free;
    }
    ClaimVerdict::HeldElsewhere { owner: holder.owner.clone(), expires_at }
}

/// This process's side of leases: its identity and the grants it holds. Cheap to clone;
/// every clone shares one book, so the executor, the agent journal and the renewal loop of
/// one process agree on what it holds.
#[derive(Clone, Debug)]
pub struct Lessee {
    owner: LeaseOwner,
    held: Arc<Mutex<BTreeMap<RunId, u64>>>,
}

impl Lessee {
    /// A process holding nothing yet.
    pub fn new(owner: LeaseOwner) -> Self {
        Self { owner, held: Arc::default() }
    }

    /// Who this process is.
    pub fn owner(&self) -> &LeaseOwner {
        &self.owner
    }

    /// The grant this process holds for `run_id`, if any.
    pub fn grant(&self, run_id: &RunId) -> Option<LeaseGrant> {
        self.book().get(run_id).map(|&token| LeaseGrant { run_id: run_id.clone(), token })
    }

    /// Notes a grant the log gave this process.
    pub fn hold(&self, grant: &LeaseGrant) {
        self.book().insert(grant.run_id.clone(), grant.token);
    }

    /// Forgets the grant for `run_id` (released, or lost to another process).
    pub fn forget(&self, run_id: &RunId) {
        self.book().remove(run_id);
    }

    /// Forgets `grant` if it is still the one held for its run; says whether it was. A
    /// renewal that raced with this process's own release (or with a fresh claim of the same
    /// run under a new token) must neither report the run lost nor drop the newer grant.
    pub fn forget_grant(&self, grant: &LeaseGrant) -> bool {
        let mut book = self.book();
        if book.get(&grant.run_id) == Some(&grant.token) {
            book.remove(&grant.run_id);
            true
        } else {
            false
        }
    }

    /// Every grant held, in run order (what the renewal loop renews).
    pub fn grants(&self) -> Vec<LeaseGrant> {
        self.book().iter().map(|(run_id, &token)| LeaseGrant { run_id: run_id.clone(), token }).collect()
    }

    fn book(&self) -> std::sync::MutexGuard<'_, BTreeMap<RunId, u64>> {
        self.held
            .lock()
            .expect("the lease book's mutex is never held across a panic: its sections only insert or remove")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(pid: u32) -> LeaseOwner {
        LeaseOwner { host: "h".into(), pid, started: 7, nonce: format!("n{pid}") }
    }

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(seconds, 0).expect("a valid instant")
    }

    #[test]
    fn the_book_holds_every_grant_in_run_order_until_it_is_forgotten() {
        let lessee = Lessee::new(owner(1));
        let grant = |run: &str, token| LeaseGrant { run_id: RunId::new(run), token };
        lessee.hold(&grant("run-b", 4));
        lessee.hold(&grant("run-a", 2));
        // Every clone shares the one book: the renewal loop sees what the executor holds.
        let renewal_loop = lessee.clone();
        assert_eq!(renewal_loop.grants(), [grant("run-a", 2), grant("run-b", 4)]);
        lessee.forget(&RunId::new("run-a"));
        assert_eq!(renewal_loop.grants(), [grant("run-b", 4)]);
        assert_eq!(renewal_loop.grant(&RunId::new("run-a")), None);
    }

    #[test]
    fn a_sole_survivor_sees_itself_alive_and_every_other_owner_dead() {
        let probe = SoleSurvivor(owner(1));
        assert_eq!(probe.liveness(&owner(1)), Liveness::Alive);
        assert_eq!(probe.liveness(&owner(2)), Liveness::Dead);
        assert_eq!(ExpiryOnly.liveness(&owner(1)), Liveness::Unknown);
    }

    #[test]
    fn a_grant_is_forgotten_only_while_it_is_the_one_held() {
        let lessee = Lessee::new(owner(1));
        let run_id = RunId::new("run-1");
        let first = LeaseGrant { run_id: run_id.clone(), token: 1 };
        let second = LeaseGrant { run_id: run_id.clone(), token: 2 };
        // Given back before the renewal answered: not held, so not a loss.
        assert!(!lessee.forget_grant(&first));
        // Claimed again under a new token: the stale renewal must not drop the new grant.
        lessee.hold(&second);
        assert!(!lessee.forget_grant(&first));
        assert_eq!(lessee.grant(&run_id), Some(second.clone()));
        // Still the one held: lost for real, and forgotten.
        assert!(lessee.forget_grant(&second));
        assert_eq!(lessee.grant(&run_id), None);
    }

    #[test]
    fn a_live_hold_is_kept_an_expired_or_dead_one_is_free() {
        let held = |expires_at| LeaseRow { owner: owner(1), token: 3, expires_at };
        let alive = |_: &LeaseOwner| Liveness::Alive;
        let dead = |_: &LeaseOwner| Liveness::Dead;
        let unknown = |_: &LeaseOwner| Liveness::Unknown;
        assert_eq!(claim_verdict(None, &owner(2), at(10), alive), ClaimVerdict::Free);
        assert_eq!(claim_verdict(Some(&held(None)), &owner(2), at(10), alive), ClaimVerdict::Free, "released");
        assert_eq!(
            claim_verdict(Some(&held(Some(at(20)))), &owner(2), at(10), alive),
            ClaimVerdict::HeldElsewhere { owner: owner(1), expires_at: at(20) }
        );
        assert_eq!(
            claim_verdict(Some(&held(Some(at(20)))), &owner(2), at(10), unknown),
            ClaimVerdict::HeldElsewhere { owner: owner(1), expires_at: at(20) },
            "a holder the host cannot see is trusted until its expiry"
        );
        assert_eq!(claim_verdict(Some(&held(Some(at(20)))), &owner(2), at(10), dead), ClaimVerdict::Free);
        assert_eq!(claim_verdict(Some(&held(Some(at(20)))), &owner(2), at(20), alive), ClaimVerdict::Free);
        assert_eq!(claim_verdict(Some(&held(Some(at(20)))), &owner(1), at(10), dead), ClaimVerdict::Held(3));
    }
}
