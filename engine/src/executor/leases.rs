//! This process's hold on runs: claiming a run's lease, renewing every lease held, giving
//! them back.
//!
//! Owns [`claim_run`], [`renew_leases`] and [`release_runs`], the three lease requests and
//! their bookkeeping in the process's [`Lessee`]. Leases are operational state beside the
//! chain (see [`crate::lease`]): none of these writes an event.

use super::WorkflowError;
use crate::event::{Cause, RunId};
use crate::lease::{LeaseGrant, Lessee};
use crate::log::{Ask, Asking, EventLog};

/// Takes `run_id`'s lease for `lessee`, unless another process holds it live.
///
/// # Errors
///
/// [`WorkflowError::Busy`] when another process holds the run live; the log's failure.
pub async fn claim_run(
    log: &dyn EventLog,
    lessee: &Lessee,
    cause: &Cause,
    run_id: &RunId,
) -> Result<LeaseGrant, WorkflowError> {
    let grant = log.ask(Ask::claim_run(cause.clone(), run_id.clone(), lessee.owner().clone())).await?;
    lessee.hold(&grant);
    Ok(grant)
}

/// Gives back leases `lessee` is done with.
///
/// # Errors
///
/// The log's failure.
pub async fn release_runs(
    log: &dyn EventLog,
    lessee: &Lessee,
    cause: &Cause,
    grants: Vec<LeaseGrant>,
) -> Result<(), WorkflowError> {
    if grants.is_empty() {
        return Ok(());
    }
    for grant in &grants {
        lessee.forget(&grant.run_id);
    }
    log.ask(Ask::release_leases(cause.clone(), grants)).await?;
    Ok(())
}

/// Renews every lease `lessee` holds; returns the runs it lost to another process (whose
/// later writes from here will be fenced). A grant this process gave back (or replaced)
/// while the renewal was on its way is not a loss: only a grant still held when the answer
/// comes is forgotten and reported. The binary calls it at a third of the lease's time to
/// live.
///
/// # Errors
///
/// The log's failure.
pub async fn renew_leases(log: &dyn EventLog, lessee: &Lessee, cause: &Cause) -> Result<Vec<RunId>, WorkflowError> {
    let grants = lessee.grants();
    if grants.is_empty() {
        return Ok(Vec::new());
    }
    let renewal = log.ask(Ask::renew_leases(cause.clone(), lessee.owner().clone(), grants.clone())).await?;
    let lost = grants
        .iter()
        .filter(|grant| renewal.lost.contains(&grant.run_id) && lessee.forget_grant(grant))
        .map(|grant| grant.run_id.clone())
        .collect();
    Ok(lost)
}
