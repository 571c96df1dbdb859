//! Decisions about run leases: claims, renewals, releases, and the fencing check every write
//! for a run passes (see [`crate::lease`] for the rule).

use super::Decider;
use crate::event::RunId;
use crate::lease::{ClaimVerdict, LeaseEffect, LeaseGrant, LeaseOwner, LeaseUse, LeaseView, claim_verdict};
use crate::ledger::protocol::{Refusal, ReplyTarget};
use crate::ledger::state::Run;

/// Refuses a write for `run_id` that does not present the run's current fencing token. A
/// run never leased (one started by this very command, or before leases existed) is not
/// fenced.
pub(super) fn check_fence(run_id: &RunId, lease: &LeaseUse, leases: &dyn LeaseView) -> Result<(), Refusal> {
    let Some(current) = leases.holder(run_id) else {
        return Ok(());
    };
    match lease.grant() {
        Some(grant) if &grant.run_id == run_id && grant.token == current.token => Ok(()),
        presented => Err(Refusal::Fenced {
            run_id: run_id.clone(),
            presented: presented.filter(|g| &g.run_id == run_id).map(|g| g.token),
            current: current.token,
            holder: current.owner,
        }),
    }
}

impl Decider<'_> {
    /// The starter of a new run holds it with the first token.
    pub(super) fn hold_new_run(&mut self, run_id: &RunId, owner: &LeaseOwner) {
        let expires_at = self.later(self.leases.ttl_ms());
        self.effects.push(LeaseEffect::Hold { run_id: run_id.clone(), owner: owner.clone(), token: 1, expires_at });
    }

    /// Claims `run_id` for `owner` unless another process holds it live.
    pub(super) fn claim_run(&mut self, run_id: &RunId, owner: &LeaseOwner) -> Result<ReplyTarget, Refusal> {
        let run = self.view.run(run_id).ok_or_else(|| Refusal::UnknownRun(run_id.clone()))?;
        match self.claim(&run, owner) {
            Ok(grant) => Ok(ReplyTarget::Claimed(grant)),
            Err(holder) => Err(holder),
        }
    }

    /// The claim rule applied to one run: the grant (the next token when the hold changes
    /// hands) or the refusal naming the live holder.
    pub(super) fn claim(&mut self, run: &Run, owner: &LeaseOwner) -> Result<LeaseGrant, Refusal> {
        let run_id = &run.run_id;
        let holder = self.leases.holder(run_id);
        let token = match claim_verdict(holder.as_ref(), owner, self.now, |o| self.leases.liveness(o)) {
            ClaimVerdict::Held(token) => token,
            ClaimVerdict::Free => holder.map_or(0, |row| row.token) + 1,
            ClaimVerdict::HeldElsewhere { owner, expires_at } => {
                return Err(Refusal::LeaseHeld { run_id: run_id.clone(), owner, expires_at });
            }
        };
        let expires_at = self.later(self.leases.ttl_ms());
        self.effects.push(LeaseEffect::Hold { run_id: run_id.clone(), owner: owner.clone(), token, expires_at });
        Ok(LeaseGrant { run_id: run_id.clone(), token })
    }

    /// Extends the holds `owner` still has; reports the others lost.
    pub(super) fn renew(&mut self, owner: &LeaseOwner, grants: &[LeaseGrant]) -> ReplyTarget {
        let mut lost = Vec::new();
        for grant in grants {
            match self.leases.holder(&grant.run_id) {
                Some(row) if row.token == grant.token && &row.owner == owner && row.expires_at.is_some() => {
                    let expires_at = self.later(self.leases.ttl_ms());
                    self.effects.push(LeaseEffect::Hold {
                        run_id: grant.run_id.clone(),
                        owner: owner.clone(),
                        token: grant.token,
                        expires_at,
                    });
                }
                _ => lost.push(grant.run_id.clone()),
            }
        }
        ReplyTarget::Renewed(lost)
    }

    /// Ends a hold that is still the current one (a stale grant releases nothing).
    pub(super) fn release(&mut self, grant: &LeaseGrant) {
        if self.leases.holder(&grant.run_id).is_some_and(|row| row.token == grant.token) {
            self.effects.push(LeaseEffect::Release { run_id: grant.run_id.clone() });
        }
    }
}
