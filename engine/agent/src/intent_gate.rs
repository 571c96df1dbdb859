//! The harness's [`EffectGate`] over the executor: an agent's effect goes
//! through the same intent lifecycle as a workflow's.
//!
//! Owns [`IntentGate`]. Guard step 8 is [`executor::reserve_for_run`] (key + fingerprint +
//! money, the cumulative invariants and the reference check in one commit, journaled on the
//! agent's run); what a delegation's carve may take of the run's money is read from the
//! run's intents, as the ledger sums them; step 9 reads the intent's approval, which the ledger binds to the
//! fingerprint and re-checks, with its expiry, when the attempt starts; step 10 — the tool
//! body — calls [`IntentGate::drive`], which is [`executor::drive_intent`]: write-ahead
//! attempts, classification, reconciliation. It never calls the provider itself and never
//! decides a transition: the ledger does.
//!
//! # An irreversible effect waits for a human
//!
//! A call whose tool is irreversible and names no approval policy asks what its effect class
//! decides ([`ApprovalAsk::ByEffectClass`]): a human, unless the operator's policy in force
//! ([`IntentGate::under_policy`]) sets `irreversible_without_approval` for the intent's
//! tenant and operation; then the reservation records that policy's stamp. A gate with no
//! policy never lowers it.
//!
//! A refund needs nothing more. A charge needs a payment method, which the model never
//! holds nor names: only a gate its host bound to one ([`IntentGate::paying_with`]) accepts a
//! charge, and sends it with that secret (never stored, never shown to the model).

use crate::{ApprovalAsk, ApprovalDecision, EffectGate, EffectIntent, EffectOutcome, EffectTicket, GateDecision};
use engine::event::{Cause, IntentKey, RunId};
use engine::executor::{self, HumanApproval, IntentOutcome, IntentRequest, Reservation, Runtime, WorkflowError};
use engine::ledger::IntentStatus;
use engine::log::{Ask, Asking, IntentAnswer};
use engine::policy::InForce;
use engine::provider::{BoxFuture, CallOutcome, EffectKind, Secret, UnknownReason};
use std::sync::Arc;

/// The intent lifecycle behind an agent's effect tools.
#[derive(Clone)]
pub struct IntentGate {
    runtime: Runtime,
    cause: Cause,
    /// The host's payment method for the run's charges, when it bound one.
    payment_method: Option<Secret>,
    /// The operator's policy in force, which may lower an irreversible effect's approval.
    policy: Option<Arc<InForce>>,
}

impl IntentGate {
    /// A gate over `runtime`; every command it sends carries `cause`.
    pub fn new(runtime: Runtime, cause: Cause) -> Self {
        Self { runtime, cause, payment_method: None, policy: None }
    }

    /// The same gate, accepting charges too, each sent with `payment_method` — the host's
    /// card for this run, chosen by the host and never by the model.
    pub fn paying_with(self, payment_method: Secret) -> Self {
        Self { payment_method: Some(payment_method), ..self }
    }

    /// The same gate, under the operator's policy in force `policy`: an irreversible effect
    /// whose tool names no approval policy runs without a human where `policy` lowers it for
    /// the intent's tenant and operation, its reservation recording `policy`'s stamp.
    pub fn under_policy(self, policy: InForce) -> Self {
        Self { policy: Some(Arc::new(policy)), ..self }
    }

    /// The stamp of the operator's policy in force when it lowers the effect-class default for
    /// `tenant`'s `kind` of effect (`irreversible_without_approval`): a host renders its
    /// tools' descriptions from this very answer, so what the model is told is what the gate
    /// then does. `None`: an irreversible effect that names no approval waits for a human.
    pub fn lowers_irreversible(&self, tenant: &str, kind: EffectKind) -> Option<engine::policy::PolicyStamp> {
        self.lowering(tenant, kind).map(|governing| governing.stamp)
    }

    /// The rules of the policy in force for `tenant`'s `kind`, when they lower the default.
    fn lowering(&self, tenant: &str, kind: EffectKind) -> Option<engine::policy::Governing> {
        let governing = self.policy.as_deref()?.governing(tenant, kind);
        governing.rules.irreversible_without_approval.then_some(governing)
    }

    /// What the spine is asked for a call's `approval`: an effect class's ask resolved against
    /// the policy in force for `intent`'s tenant and `kind`.
    fn human_approval(&self, approval: ApprovalAsk, intent: &EffectIntent, kind: EffectKind) -> HumanApproval {
        match approval {
            ApprovalAsk::Required => HumanApproval::Required,
            ApprovalAsk::NotRequired => HumanApproval::NotRequired,
            ApprovalAsk::ByEffectClass => {
                self.lowering(&intent.tenant, kind).map_or(HumanApproval::Required, HumanApproval::LoweredBy)
            }
        }
    }

    /// Guard step 10 for a reserved intent: takes it as far as the lifecycle allows now.
    pub async fn drive(&self, ticket: &EffectTicket) -> Result<IntentOutcome, WorkflowError> {
        let key = IntentKey::parse(&ticket.key)
            .ok_or_else(|| WorkflowError::Failed(format!("{} is not an intent key", ticket.key)))?;
        executor::drive_intent(&self.runtime, self.cause.clone(), &key, self.payment_method.as_ref()).await
    }

    async fn reserve(&self, run_id: &str, tool: &str, intent: &EffectIntent, approval: ApprovalAsk) -> GateDecision {
        let refused = |code: &str, message: String| GateDecision::Refused { code: code.to_owned(), message };
        let kind = match intent.operation.as_str() {
            "refund" => EffectKind::Refund,
            "charge" if self.payment_method.is_some() => EffectKind::Charge,
            other => {
                return refused(
                    "unsupported_operation",
                    format!(
                        "{other} cannot go through this agent: only refunds, and charges of a card its host bound."
                    ),
                );
            }
        };
        let (Some(amount_minor), Some(currency)) = (intent.amount_minor, intent.currency.clone()) else {
            return refused(
                "invalid_arguments",
                format!("a {other} needs an amount and a currency.", other = kind.as_str()),
            );
        };
        let request = IntentRequest {
            kind,
            tenant: intent.tenant.clone(),
            intent_id: intent.intent_id.clone(),
            order_id: intent.reference.clone(),
            business_ref: intent.reference.clone(),
            amount_minor,
            currency,
            payload: intent.payload.clone(),
            payment_method: self.payment_method.clone(),
            tool: Some(tool.to_owned()),
        };
        let cause = self.cause.clone().for_run(&RunId::new(run_id));
        let approval = self.human_approval(approval, intent, kind);
        // A run resumed under a newer policy is held to the stricter of it and its own.
        let policy = self.policy.as_deref().map(|policy| policy.governing(&intent.tenant, kind));
        match executor::reserve_for_run(&self.runtime, &cause, &RunId::new(run_id), &request, approval, policy).await {
            Ok(Reservation::Reserved(answer)) if answer.intent.status == IntentStatus::Validated => {
                GateDecision::Deduplicated {
                    content: serde_json::json!({
                        "status": "validated",
                        "source": "deduplicated",
                        "receipt": answer.intent.evidence.as_ref().map(|e| e.provider_ref.clone()),
                        "note": "this exact refund was already made; nothing was sent again",
                    })
                    .to_string(),
                }
            }
            Ok(Reservation::Reserved(answer)) => GateDecision::Proceed(EffectTicket {
                key: answer.intent.key().to_string(),
                fingerprint: answer.intent.definition.fingerprint.clone(),
                // The ledger's flag: the tool's policy or the run's threshold, the stricter.
                approval_required: answer.intent.approval_required,
            }),
            Ok(Reservation::Rejected(outcome)) => refused(
                outcome.code.as_ref().map_or("rejected", |code| code.as_str()),
                format!("refused by the ledger: {}. Nothing was executed.", outcome.details.join("; ")),
            ),
            Err(error) => refused(
                "intent_unavailable",
                format!("the intent could not be reserved ({error}); nothing was executed."),
            ),
        }
    }

    /// What `run_id` has left of its money budget: its limit less the amounts of the intents
    /// it reserved whose money counts (`Intent::money_committed`, as the ledger's reservation
    /// check sums them), read from its journal's intent links. A log that cannot be read
    /// leaves nothing to carve.
    async fn money_left(&self, run_id: &str) -> Option<i64> {
        let run_id = RunId::new(run_id);
        let cause = self.cause.clone().for_run(&run_id);
        let Ok(history) = self.runtime.log.ask(Ask::load_run(cause.clone(), run_id.clone())).await else {
            return Some(0);
        };
        let max = history.run.limits.cost_minor_max?;
        let keys: std::collections::BTreeSet<IntentKey> = history
            .journal
            .iter()
            .filter_map(|entry| entry.name.strip_prefix("intent:").and_then(IntentKey::parse))
            .collect();
        let mut committed = 0_i64;
        for key in keys {
            let Ok(IntentAnswer { intent, .. }) = self.runtime.log.ask(Ask::observe(cause.clone(), key)).await else {
                return Some(0);
            };
            if intent.run_id == run_id && intent.money_committed() {
                committed = committed.saturating_add(intent.definition.amount_minor);
            }
        }
        Some(max.saturating_sub(committed).max(0))
    }

    async fn approval(&self, ticket: &EffectTicket) -> ApprovalDecision {
        let Some(key) = IntentKey::parse(&ticket.key) else {
            return ApprovalDecision::Denied { reason: format!("{} is not an intent key", ticket.key) };
        };
        // Checked, not just read: an approval that lapsed is recorded expired, so the intent
        // awaits a fresh one (and `keel approve` accepts it) instead of stranding the run.
        let checked = self.runtime.log.ask(Ask::check_approval(self.cause.clone(), key)).await;
        match checked {
            Ok(IntentAnswer { intent, .. }) => match intent.status {
                IntentStatus::AwaitingApproval => ApprovalDecision::Pending,
                IntentStatus::Rejected => ApprovalDecision::Denied {
                    reason: intent.note.clone().unwrap_or_else(|| "the intent was rejected".to_owned()),
                },
                // Approved and still valid (the ledger re-checks fingerprint and expiry when the
                // attempt starts), or already past approval: the driver takes it from there.
                _ => ApprovalDecision::Approved,
            },
            // The log cannot say: waiting is the only safe answer.
            Err(_) => ApprovalDecision::Pending,
        }
    }
}

impl EffectGate for IntentGate {
    fn reserve<'a>(
        &'a self,
        run_id: &'a str,
        tool: &'a str,
        intent: &'a EffectIntent,
        approval: ApprovalAsk,
    ) -> BoxFuture<'a, GateDecision> {
        Box::pin(self.reserve(run_id, tool, intent, approval))
    }

    fn approval<'a>(&'a self, ticket: &'a EffectTicket, _intent: &'a EffectIntent) -> BoxFuture<'a, ApprovalDecision> {
        Box::pin(self.approval(ticket))
    }

    fn money_left<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Option<i64>> {
        Box::pin(self.money_left(run_id))
    }

    /// A body that returned recorded its outcome through the driver already. A body cut
    /// short (the caller's interrupt, the deadline) leaves an attempt in flight without an
    /// answer: it is recorded unknown now, so reconciliation takes it on at once instead of
    /// waiting for a recovery. An attempt that was not in flight is left as it is.
    fn settle<'a>(&'a self, ticket: &'a EffectTicket, outcome: &'a EffectOutcome) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let (EffectOutcome::Unknown { detail }, Some(key)) = (outcome, IntentKey::parse(&ticket.key)) else {
                return;
            };
            let observed = self.runtime.log.ask(Ask::observe(self.cause.clone(), key.clone()));
            let Ok(IntentAnswer { intent, .. }) = observed.await else {
                return;
            };
            if intent.status == IntentStatus::Attempting {
                let unknown = CallOutcome::Unknown { reason: UnknownReason::Interrupted, detail: detail.clone() };
                let record = Ask::record_outcome(self.cause.clone(), key, intent.attempts, unknown);
                if let Err(error) = self.runtime.log.ask(record).await {
                    tracing::warn!(%error, "the interrupted attempt stays in flight: recovery will declare it unknown");
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::clock::ManualClock;
    use engine::lease::{LeaseOwner, Lessee};
    use engine::memory::{MemoryLog, MemoryProvider};
    use engine::provider::Capability;

    fn gate() -> IntentGate {
        let clock = Arc::new(ManualClock::new(chrono::DateTime::UNIX_EPOCH));
        let capability = Capability {
            dedup_by_key: true,
            lookup: true,
            key_window_ms: 86_400_000,
            consistency_window_ms: 2_000,
            request_timeout_ms: 0,
        };
        let runtime = Runtime {
            log: Arc::new(MemoryLog::new(clock.clone())),
            provider: Arc::new(MemoryProvider::new(capability)),
            clock,
            lessee: Lessee::new(LeaseOwner::named("test")),
        };
        IntentGate::new(runtime, Cause::command("test"))
    }

    fn charge() -> EffectIntent {
        EffectIntent {
            operation: "charge".into(),
            tenant: "t".into(),
            intent_id: "pay-inv_1".into(),
            reference: "inv_1".into(),
            payload: serde_json::json!({"invoice": "inv_1"}),
            amount_minor: Some(100),
            currency: Some("EUR".into()),
        }
    }

    #[tokio::test]
    async fn a_charge_goes_through_only_a_gate_its_host_bound_to_a_card() {
        let refused = gate().reserve("r1", "pay", &charge(), ApprovalAsk::NotRequired).await;
        assert!(
            matches!(&refused, GateDecision::Refused { code, .. } if code == "unsupported_operation"),
            "{refused:?}"
        );
        // Bound to a card, the charge reaches the ledger (which knows no run r1: refused there).
        let bound = gate().paying_with(Secret::new("pm_card_visa_4242424242"));
        let reached = bound.reserve("r1", "pay", &charge(), ApprovalAsk::NotRequired).await;
        assert!(matches!(&reached, GateDecision::Refused { code, .. } if code == "intent_unavailable"), "{reached:?}");
    }
}
