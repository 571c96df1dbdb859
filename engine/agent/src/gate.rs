//! Hooks the spine implements for tools with effects: intent reservation and approval.
//!
//! Owns [`EffectGate`] (guard steps 8 and 9) and its plain-data requests and answers. A tool
//! whose effect class is `mutation` or `irreversible` declares how its bound arguments map
//! to an [`EffectIntent`]; the guard asks the gate to reserve it (key + fingerprint, with the
//! cumulative invariants checked in the same transaction) with the tool's approval policy,
//! asks for approval when the reservation requires it — the tool's policy (for an
//! irreversible tool that names none, its class: a human unless the operator's policy lowers
//! it, [`ApprovalAsk`]) or the spine's threshold, the stricter wins (bound to the
//! fingerprint, expiring), runs the body with the
//! [`EffectTicket`], and reports the body's [`EffectOutcome`] to the gate. The spine's intent
//! lifecycle is the real implementation (`IntentGate`); tests use [`MemoryGate`].

use engine::provider::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// What an effect tool call asks for, derived from its bound arguments by the tool itself
/// (so no argument can name an order the tool was not bound to).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectIntent {
    /// Operation, e.g. `refund`.
    pub operation: String,
    /// Tenant.
    pub tenant: String,
    /// The caller-stable intent id (e.g. derived from the run and the call's signature).
    pub intent_id: String,
    /// The business reference the effect is about (the order): while one intent on it is
    /// pending, a second key for it is refused.
    pub reference: String,
    /// The fields that define the effect; fingerprinted by canonical JSON.
    pub payload: Value,
    /// Money moved, minor units, when the effect moves money.
    pub amount_minor: Option<i64>,
    /// ISO 4217 code, when the effect moves money.
    pub currency: Option<String>,
}

impl EffectIntent {
    /// The intent key `operation:tenant:intent_id`.
    pub fn key(&self) -> String {
        format!("{}:{}:{}", self.operation, self.tenant, self.intent_id)
    }

    /// The payload fingerprint.
    pub fn fingerprint(&self) -> String {
        engine::canonical::fingerprint(&self.payload)
    }
}

/// What the gate hands the body when the intent is reserved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectTicket {
    /// The intent key, sent as the provider's idempotency key.
    pub key: String,
    /// The payload fingerprint the reservation (and any approval) is bound to.
    pub fingerprint: String,
    /// The reserved intent waits for a human: the tool's approval policy asked for it, or
    /// the spine's approval threshold does. Guard step 9 asks the gate whenever this is set,
    /// so neither source of truth can let the other skip a human.
    pub approval_required: bool,
}

/// The gate's answer to a reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateDecision {
    /// Reserved: the body may run with this ticket.
    Proceed(EffectTicket),
    /// Same key, same fingerprint, already validated: this result, no effect, no body.
    Deduplicated {
        /// The stored result the model reads.
        content: String,
    },
    /// Refused before any effect (`intent_payload_mismatch`, `intent_pending`,
    /// `budget_exhausted`, `policy_denied`…): an error result the model reads.
    Refused {
        /// Stable code.
        code: String,
        /// What the model reads.
        message: String,
    },
}

/// The gate's answer to an approval check, re-checked at dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApprovalDecision {
    /// A valid approval bound to this fingerprint exists.
    Approved,
    /// A human denied it (or the approval is for another fingerprint, or expired).
    Denied {
        /// What the model reads.
        reason: String,
    },
    /// No decision yet: the run suspends (status `awaiting_approval`) with the call reserved
    /// and no result; a resume asks again.
    Pending,
}

/// What a call asks of a human at reservation (guard step 8), before the spine's own rule
/// (the run's threshold) is added to it: the stricter wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApprovalAsk {
    /// The tool's approval policy asks a human for this call.
    Required,
    /// The tool's approval policy asks none.
    NotRequired,
    /// An irreversible tool that names no approval policy: its effect class asks a human,
    /// unless the operator's policy in force lowers it for the intent's operation
    /// (`irreversible_without_approval`), which the reservation then records with that
    /// policy's stamp. A gate without a policy never lowers it.
    ByEffectClass,
}

/// What the body reports about its effect.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum EffectOutcome {
    /// Confirmed, with the provider's evidence id.
    Validated {
        /// Provider receipt id.
        evidence: String,
    },
    /// The provider's definitive "no effect".
    Declined {
        /// Decline code.
        code: String,
    },
    /// The effect may or may not have happened: the run stops `outcome_unknown`.
    Unknown {
        /// Why.
        detail: String,
    },
    /// Nothing was sent: the intent's approval lapsed between the check and the dispatch.
    /// The call stays reserved without a result and the run suspends for a fresh approval.
    AwaitingApproval,
}

/// Guard steps 8 (intent reservation) and 9 (approval), implemented by the spine.
pub trait EffectGate: Send + Sync {
    /// Reserves key + fingerprint (+ money, + cumulative invariants) for `run_id`, proposed
    /// by a call of the registry's tool `tool` (recorded on the intent).
    /// `approval` is what the tool's policy or its effect class asks for this call; the
    /// reservation requires a human when it, or the spine's own rule, says so (the stricter
    /// wins), and its ticket says which.
    fn reserve<'a>(
        &'a self,
        run_id: &'a str,
        tool: &'a str,
        intent: &'a EffectIntent,
        approval: ApprovalAsk,
    ) -> BoxFuture<'a, GateDecision>;
    /// Checks for a valid approval bound to `ticket.fingerprint`.
    fn approval<'a>(&'a self, ticket: &'a EffectTicket, intent: &'a EffectIntent) -> BoxFuture<'a, ApprovalDecision>;
    /// Records how the body's effect ended (validated / declined / unknown).
    fn settle<'a>(&'a self, ticket: &'a EffectTicket, outcome: &'a EffectOutcome) -> BoxFuture<'a, ()>;
    /// What `run_id` has left of its money budget, minor units (`None`: it has none): read
    /// before a delegation's carve, whose money it bounds. A gate that cannot read it answers
    /// `Some(0)`: nothing is carved that is not known to be left.
    fn money_left<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Option<i64>>;
}

/// An in-memory [`EffectGate`] for tests, as `MemoryJournal` is for the journal: one payload
/// fingerprint per intent key, so a repeated call is deduplicated and a changed one refused
/// `intent_payload_mismatch`, as the spine answers; it holds no operator's policy, so an
/// irreversible effect's class is never lowered (it requires a human); every approval check
/// gets the one answer
/// it was built with; what each effect was settled with is kept, in order, for the test to
/// read. It checks no reference, and money only when given a budget
/// ([`MemoryGate::with_money_budget`]): the sum of the amounts it reserved, as the spine's
/// run budget counts them.
#[derive(Debug)]
pub struct MemoryGate {
    intents: Mutex<BTreeMap<String, String>>,
    approval: ApprovalDecision,
    settled: Mutex<Vec<EffectOutcome>>,
    reserved: Mutex<Vec<(String, String)>>,
    budget: Option<i64>,
    committed: Mutex<i64>,
}

impl MemoryGate {
    /// A gate that answers every approval check with `approval`.
    pub fn new(approval: ApprovalDecision) -> Self {
        Self {
            intents: Mutex::new(BTreeMap::new()),
            approval,
            settled: Mutex::new(Vec::new()),
            reserved: Mutex::new(Vec::new()),
            budget: None,
            committed: Mutex::new(0),
        }
    }

    /// The same gate, holding every run to a money budget of `max_minor`: a reservation past
    /// it is refused `budget_exhausted`, as the spine refuses it.
    pub fn with_money_budget(self, max_minor: i64) -> Self {
        Self { budget: Some(max_minor), ..self }
    }

    /// Every reservation asked of this gate, oldest first: the run it was asked for and the
    /// intent key.
    pub fn reservations(&self) -> Vec<(String, String)> {
        self.reserved.lock().expect("the gate's lock is never held across a panic").clone()
    }

    /// What the effects that went through this gate were settled with, oldest first.
    pub fn settled(&self) -> Vec<EffectOutcome> {
        self.settled.lock().expect("the gate's lock is never held across a panic").clone()
    }
}

impl EffectGate for MemoryGate {
    fn reserve<'a>(
        &'a self,
        run_id: &'a str,
        _tool: &'a str,
        intent: &'a EffectIntent,
        approval: ApprovalAsk,
    ) -> BoxFuture<'a, GateDecision> {
        let approval_required = approval != ApprovalAsk::NotRequired;
        let (key, fingerprint) = (intent.key(), intent.fingerprint());
        let asked = (run_id.to_owned(), key.clone());
        self.reserved.lock().expect("the gate's lock is never held across a panic").push(asked);
        let mut intents = self.intents.lock().expect("the gate's lock is never held across a panic");
        let decision = match intents.get(&key) {
            Some(existing) if *existing == fingerprint => {
                GateDecision::Deduplicated { content: "already refunded".into() }
            }
            Some(_) => GateDecision::Refused {
                code: "intent_payload_mismatch".into(),
                message: "this idempotency key was used with other arguments".into(),
            },
            None => {
                let mut committed = self.committed.lock().expect("the gate's lock is never held across a panic");
                let amount = intent.amount_minor.unwrap_or(0);
                match self.budget {
                    Some(max) if committed.saturating_add(amount) > max => GateDecision::Refused {
                        code: "budget_exhausted".into(),
                        message: format!("the run has committed {committed} of its {max}; {amount} more asked"),
                    },
                    _ => {
                        *committed = committed.saturating_add(amount);
                        intents.insert(key.clone(), fingerprint.clone());
                        GateDecision::Proceed(EffectTicket { key, fingerprint, approval_required })
                    }
                }
            }
        };
        Box::pin(async move { decision })
    }

    fn approval<'a>(&'a self, _ticket: &'a EffectTicket, _intent: &'a EffectIntent) -> BoxFuture<'a, ApprovalDecision> {
        Box::pin(async move { self.approval.clone() })
    }

    fn settle<'a>(&'a self, _ticket: &'a EffectTicket, outcome: &'a EffectOutcome) -> BoxFuture<'a, ()> {
        self.settled.lock().expect("the gate's lock is never held across a panic").push(outcome.clone());
        Box::pin(async {})
    }

    fn money_left<'a>(&'a self, _run_id: &'a str) -> BoxFuture<'a, Option<i64>> {
        let committed = *self.committed.lock().expect("the gate's lock is never held across a panic");
        let left = self.budget.map(|max| max.saturating_sub(committed).max(0));
        Box::pin(async move { left })
    }
}
