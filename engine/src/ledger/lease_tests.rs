//! Leases at the ledger's boundary: the lease rows the store holds, one command, and what
//! [`decide`] makes of it — the fencing refusal, or the holds it writes (renewed, released,
//! taken by a new run's starter). The store and the binary's suites prove the same through
//! real processes; these rows pin the rule where it is decided.

use super::tests::{key, nine_am, reserve, run, tier};
use super::*;
use crate::clock::ManualClock;
use crate::event::{Cause, RunId, RunLimits};
use crate::lease::{LeaseEffect, LeaseGrant, LeaseOwner, LeaseRow, LeaseUse, LeaseView, Liveness};
use crate::limits;
use crate::memory::MemoryLog;
use std::collections::BTreeMap;
use std::sync::Arc;

fn owner(name: &str) -> LeaseOwner {
    LeaseOwner::named(name)
}

/// The lease rows of a store, as data.
struct Rows(BTreeMap<RunId, LeaseRow>);

impl Rows {
    /// `run-1` held by `holder` with `token`, live for an hour, or released.
    fn held(holder: &str, token: u64, live: bool) -> Self {
        let expires_at = live.then(|| nine_am() + chrono::Duration::hours(1));
        Self(BTreeMap::from([(run(), LeaseRow { owner: owner(holder), token, expires_at })]))
    }

    fn none() -> Self {
        Self(BTreeMap::new())
    }
}

impl LeaseView for Rows {
    fn holder(&self, run_id: &RunId) -> Option<LeaseRow> {
        self.0.get(run_id).cloned()
    }

    fn liveness(&self, _owner: &LeaseOwner) -> Liveness {
        Liveness::Alive
    }

    fn ttl_ms(&self) -> u64 {
        limits::LEASE_TTL_DEFAULT_MS
    }
}

/// A log with the fixture's charge reserved by `run-1`, never sent.
fn reserved() -> MemoryLog {
    let log = MemoryLog::new(Arc::new(ManualClock::new(nine_am())));
    log.execute_now(&reserve(tier(true, true), RunLimits::default(), false)).expect("reserved");
    log
}

fn grant(run_id: RunId, token: u64) -> LeaseGrant {
    LeaseGrant { run_id, token }
}

/// A write for `run-1` (its attempt) presenting `lease`.
fn attempt_under(lease: LeaseUse) -> Command {
    Command::new(Cause::command("test"), Action::StartAttempt { key: key(), run_id: run() }).under(lease)
}

fn fenced(decided: Result<Decision, Refusal>) -> Option<(Option<u64>, u64)> {
    match decided {
        Err(Refusal::Fenced { presented, current, .. }) => Some((presented, current)),
        _ => None,
    }
}

#[test]
fn a_write_passes_only_with_the_runs_current_token() {
    let log = reserved();
    let ledger = log.ledger();
    let decide_with = |rows: &Rows, lease: LeaseUse| decide(&ledger, rows, &attempt_under(lease), nine_am());
    let held = Rows::held("a", 2, true);
    assert!(decide_with(&held, LeaseUse::Hold(grant(run(), 2))).is_ok(), "the current token writes");
    assert_eq!(fenced(decide_with(&held, LeaseUse::Hold(grant(run(), 1)))), Some((Some(1), 2)), "a stale token");
    assert_eq!(
        fenced(decide_with(&held, LeaseUse::Hold(grant(RunId::new("run-2"), 2)))),
        Some((None, 2)),
        "another run's grant, even with the same number, is no grant for this run"
    );
    assert_eq!(fenced(decide_with(&held, LeaseUse::None)), Some((None, 2)), "no grant at all");
    assert!(decide_with(&Rows::none(), LeaseUse::None).is_ok(), "a run never leased is not fenced");
}

#[test]
fn a_renewal_extends_only_what_its_owner_still_holds() {
    let ledger = reserved().ledger();
    let renew = |rows: &Rows, by: &str, token: u64| {
        let action = Action::RenewLeases { owner: owner(by), grants: vec![grant(run(), token)] };
        let decision =
            decide(&ledger, rows, &Command::new(Cause::command("test"), action), nine_am()).expect("renewed");
        let lost = match decision.target {
            ReplyTarget::Renewed(lost) => lost,
            other => panic!("a renewal answers what was lost, got {other:?}"),
        };
        (decision.leases, lost)
    };
    let held = Rows::held("a", 2, true);
    let (effects, lost) = renew(&held, "a", 2);
    assert!(lost.is_empty());
    let expires_at = nine_am() + chrono::Duration::milliseconds(limits::LEASE_TTL_DEFAULT_MS as i64);
    assert_eq!(effects, [LeaseEffect::Hold { run_id: run(), owner: owner("a"), token: 2, expires_at }]);
    for (rows, by, token, why) in [
        (&held, "a", 1, "a stale token"),
        (&held, "b", 2, "another owner with the current token"),
        (&Rows::held("a", 2, false), "a", 2, "a hold already released"),
        (&Rows::none(), "a", 1, "a run never leased"),
    ] {
        let (effects, lost) = renew(rows, by, token);
        assert_eq!((effects, lost), (vec![], vec![run()]), "{why}: lost, nothing extended");
    }
}

#[test]
fn a_release_ends_the_current_hold_and_a_stale_one_releases_nothing() {
    let ledger = reserved().ledger();
    let release = |token: u64| {
        let action = Action::ReleaseLeases { grants: vec![grant(run(), token)] };
        let command = Command::new(Cause::command("test"), action);
        decide(&ledger, &Rows::held("a", 2, true), &command, nine_am()).expect("released").leases
    };
    assert_eq!(release(2), [LeaseEffect::Release { run_id: run() }]);
    assert_eq!(release(1), []);
}

#[test]
fn a_new_runs_starter_holds_it_with_the_first_token() {
    let log = MemoryLog::new(Arc::new(ManualClock::new(nine_am())));
    let mut command = reserve(tier(true, true), RunLimits::default(), false);
    if let Some(start) = command.start_run.as_mut() {
        start.owner = Some(owner("starter"));
    }
    let decision = decide(&log.ledger(), &Rows::none(), &command, nine_am()).expect("reserved");
    let expires_at = nine_am() + chrono::Duration::milliseconds(limits::LEASE_TTL_DEFAULT_MS as i64);
    assert_eq!(decision.leases, [LeaseEffect::Hold { run_id: run(), owner: owner("starter"), token: 1, expires_at }]);
}
