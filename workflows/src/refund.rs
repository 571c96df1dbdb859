//! The `refund` workflow: give money back on a charged order.
//!
//! Owns the refund input contract (the charge's fields without a payment method, and an
//! optional hold before the refund is reserved), the operator's policy for it (maximum
//! amount, allowed currencies) and its fingerprint payload. The cumulative invariant —
//! refunds reserved, unknown or validated on an order never exceed what was charged on it —
//! is checked by the ledger in the reservation's own transaction, not here: a check here
//! would race.
//!
//! # Holds
//!
//! A refund may wait before it is reserved: for a signal (`after_signal`, e.g. the returned
//! goods arriving: `keel signal RUN_ID goods_returned --by NAME`), then for a durable timer
//! (`delay_ms`, a cooling-off period). Both are journaled: a restart neither re-waits a
//! delivered signal nor moves the timer's fire time, and nothing is reserved — no money is
//! held — until both are over. Neither outlives the run's deadline: a wait not over by then
//! ends the run `deadline_exceeded`. The hold is not part of the fingerprint: it says when, not
//! what.

use crate::input::{EffectInput, Fields, check_policy};
use engine::event::SignalName;
use engine::executor::{Context, Prepared, Rejection, Workflow, WorkflowEnd, WorkflowError, end_with};
use engine::ledger::RejectCode;
use engine::limits::RUN_DEADLINE_MAX_MS;
use engine::policy::Rules;
use engine::provider::{BoxFuture, EffectKind};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The fields a refund accepts.
pub const FIELDS: [&str; 7] =
    ["tenant_id", "intent_id", "order_id", "amount_minor", "currency", "after_signal", "delay_ms"];

/// A refund's validated input: the effect, and what it waits for before it is reserved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundInput {
    /// The effect's fields.
    #[serde(flatten)]
    pub effect: EffectInput,
    /// A signal to wait for first; its payload is shown in the run's output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_signal: Option<SignalName>,
    /// A durable timer to wait out next, in ms (at most the run's deadline allows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
}

/// The refund workflow, with its policy.
#[derive(Clone, Debug, Default)]
pub struct Refund {
    /// The operator's rules for this invocation's tenant (maximum amount, currencies);
    /// `None` on paths that only resume or reconcile what was already admitted.
    pub rules: Option<Rules>,
}

impl Workflow for Refund {
    type Input = RefundInput;

    fn name(&self) -> &'static str {
        "refund"
    }

    fn prepare(&self, raw: &Value) -> Result<Prepared<RefundInput>, Rejection> {
        let mut fields = Fields::new(raw, &FIELDS);
        let effect = fields.effect();
        let after_signal = fields.optional_signal_name("after_signal");
        let delay_ms = fields.optional_ms("delay_ms", RUN_DEADLINE_MAX_MS);
        fields.finish().map_err(|details| Rejection { code: RejectCode::InvalidArguments, details })?;
        check_policy(&effect, self.rules.as_ref())?;
        Ok(Prepared::plain(RefundInput { effect, after_signal, delay_ms }))
    }

    fn run<'a>(
        &'a self,
        ctx: &'a mut Context,
        input: RefundInput,
    ) -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>> {
        Box::pin(async move {
            let signal = match &input.after_signal {
                Some(name) => Some(ctx.wait_signal(name).await?),
                None => None,
            };
            if let Some(ms) = input.delay_ms {
                ctx.sleep(ms).await?;
            }
            let outcome = ctx.intent(input.effect.intent_request(EffectKind::Refund, Map::new(), None)).await?;
            let mut end = end_with(&outcome)?;
            if let (Some(payload), Some(output)) = (signal, end.output.as_object_mut()) {
                output.insert("signal".to_owned(), payload);
            }
            Ok(end)
        })
    }
}
