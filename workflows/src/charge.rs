//! The `charge` workflow: one payment intent, seed 004's contract.
//!
//! Owns input validation (tenant UUID, intent id 12–120 chars, order id, positive integer
//! `amount_minor`, EUR/USD/XOF, a payment method id in Stripe's format (`pm_…`), unknown fields refused), the
//! operator's policy (maximum amount, allowed currencies), and the fingerprint payload. The payment method token never
//! reaches the log: the stored input and the fingerprint carry its SHA-256 only, and the
//! clear token lives in the invocation's secrets.

use crate::input::{EffectInput, Fields, check_policy};
use engine::canonical::sha256_hex;
use engine::executor::{Context, Prepared, Rejection, Workflow, WorkflowEnd, WorkflowError, end_with};
use engine::ledger::RejectCode;
use engine::policy::Rules;
use engine::provider::{BoxFuture, EffectKind, Secret};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The fields a charge accepts.
pub const FIELDS: [&str; 6] =
    ["tenant_id", "intent_id", "order_id", "amount_minor", "currency", "payment_method_token"];

/// The name of the secret holding the payment method token.
const PAYMENT_METHOD: &str = "payment_method";

/// The charge workflow, with its policy.
#[derive(Clone, Debug, Default)]
pub struct Charge {
    /// The operator's rules for this invocation's tenant (maximum amount, currencies);
    /// `None` on paths that only resume or reconcile what was already admitted.
    pub rules: Option<Rules>,
}

/// A charge's validated input: the effect's fields and the payment method's SHA-256 (the
/// token itself is a secret of the invocation, never stored).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeInput {
    /// The effect's fields.
    #[serde(flatten)]
    pub effect: EffectInput,
    /// The payment method token's SHA-256, hex.
    pub payment_method_sha256: String,
}

impl Workflow for Charge {
    type Input = ChargeInput;

    fn name(&self) -> &'static str {
        "charge"
    }

    fn prepare(&self, raw: &Value) -> Result<Prepared<ChargeInput>, Rejection> {
        let mut fields = Fields::new(raw, &FIELDS);
        let effect = fields.effect();
        let token = fields.payment_method("payment_method_token");
        fields.finish().map_err(|details| Rejection { code: RejectCode::InvalidArguments, details })?;
        check_policy(&effect, self.rules.as_ref())?;
        Ok(Prepared {
            input: ChargeInput { effect, payment_method_sha256: sha256_hex(token.as_bytes()) },
            secrets: BTreeMap::from([(PAYMENT_METHOD.to_owned(), Secret::new(token))]),
        })
    }

    fn run<'a>(
        &'a self,
        ctx: &'a mut Context,
        input: ChargeInput,
    ) -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>> {
        Box::pin(async move {
            let hashed = Map::from_iter([(
                "payment_method_sha256".to_owned(),
                Value::String(input.payment_method_sha256.clone()),
            )]);
            let request = input.effect.intent_request(EffectKind::Charge, hashed, ctx.secret(PAYMENT_METHOD));
            let outcome = ctx.intent(request).await?;
            end_with(&outcome)
        })
    }
}
