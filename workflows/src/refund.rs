//! The `refund` workflow: give money back on a charged order.
//!
//! Owns the refund input contract (the charge's fields without a payment method), the
//! operator's policy for it (maximum amount, allowed currencies) and its fingerprint payload. The cumulative invariant — refunds reserved, unknown or validated on
//! an order never exceed what was charged on it — is checked by the ledger in the
//! reservation's own transaction, not here: a check here would race.

use crate::input::{EffectInput, Fields, check_policy};
use engine::executor::{Context, Prepared, Rejection, Workflow, WorkflowEnd, WorkflowError, end_with};
use engine::ledger::RejectCode;
use engine::policy::Rules;
use engine::provider::{BoxFuture, EffectKind};
use serde_json::{Map, Value};

/// The fields a refund accepts.
pub const FIELDS: [&str; 5] = ["tenant_id", "intent_id", "order_id", "amount_minor", "currency"];

/// The refund workflow, with its policy.
#[derive(Clone, Debug, Default)]
pub struct Refund {
    /// The operator's rules for this invocation's tenant (maximum amount, currencies);
    /// `None` on paths that only resume or reconcile what was already admitted.
    pub rules: Option<Rules>,
}

impl Workflow for Refund {
    type Input = EffectInput;

    fn name(&self) -> &'static str {
        "refund"
    }

    fn prepare(&self, raw: &Value) -> Result<Prepared<EffectInput>, Rejection> {
        let mut fields = Fields::new(raw, &FIELDS);
        let input = fields.effect();
        fields.finish().map_err(|details| Rejection { code: RejectCode::InvalidArguments, details })?;
        check_policy(&input, self.rules.as_ref())?;
        Ok(Prepared::plain(input))
    }

    fn run<'a>(
        &'a self,
        ctx: &'a mut Context,
        input: EffectInput,
    ) -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>> {
        Box::pin(async move {
            let outcome = ctx.intent(input.intent_request(EffectKind::Refund, Map::new(), None)).await?;
            end_with(&outcome)
        })
    }
}
